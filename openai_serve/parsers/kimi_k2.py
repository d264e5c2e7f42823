"""`kimi_k2`: Kimi K2 writes a message's calls in one section, `<|tool_calls_section_begin|>` ...
`<|tool_calls_section_end|>`, each call
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>` (IDX counts
the calls of the conversation). The call's name is NAME; its id is one of ours, as for every family
(the model's `functions.NAME:IDX` is not a valid Anthropic tool_use id).
"""

import regex

from openai_serve.parsers.marked_calls import sectioned_syntax
from openai_serve.parsers.tool_call_grammar import Format, calls_in_a_row, json_arguments, tag, triggered
from openai_serve.protocol.tools import Tool

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENTS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

SYNTAX = sectioned_syntax((SECTION_BEGIN, SECTION_END), (CALL_BEGIN, CALL_END),
                          head=r"\s*(?:functions\.)?(?P<name>[^<:\s]+)(?::\d+)?\s*" + regex.escape(ARGUMENTS_BEGIN))


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    calls = [tag(f"{CALL_BEGIN}functions.{tool.name}:", _numbered(tool), CALL_END) for tool in tools]
    section = tag(SECTION_BEGIN, calls_in_a_row(calls, parallel), SECTION_END)
    return triggered([SECTION_BEGIN], [section], parallel)


def _numbered(tool: Tool) -> Format:
    return {"type": "sequence", "elements": [{"type": "regex", "pattern": "[0-9]+"},
                                             {"type": "const_string", "value": ARGUMENTS_BEGIN},
                                             json_arguments(tool)]}
