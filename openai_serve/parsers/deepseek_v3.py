"""`deepseek_v3` and `deepseek_v31`: DeepSeek V3 / R1 and V3.1 write a message's calls in one section,
`<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>`, each call
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (V3.1), or in V3's older form
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`. One parser
reads both; the two names differ in the form their lazy grammar holds a call to (the one the model's
chat template teaches: V3's templates write the code fence).
"""

import regex

from openai_serve.parsers.marked_calls import sectioned_syntax
from openai_serve.parsers.tool_call_grammar import Format, calls_in_a_row, json_arguments, tag, triggered
from openai_serve.protocol.tools import Tool

SECTION_BEGIN = "<｜tool▁calls▁begin｜>"
SECTION_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEPARATOR = "<｜tool▁sep｜>"

SYNTAX = sectioned_syntax(
    (SECTION_BEGIN, SECTION_END), (CALL_BEGIN, CALL_END),
    head=r"(?:function" + regex.escape(SEPARATOR) + r"(?P<name>[^\n<]+)\n```json\n|(?!function"
    + regex.escape(SEPARATOR) + r")(?P<name>[^\n<]+?)" + regex.escape(SEPARATOR) + ")",
    tail=r"\s*(?:```\s*)?",  # V3's code fence
)


def v3_call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    calls = [tag(f"{CALL_BEGIN}function{SEPARATOR}{tool.name}\n```json\n", json_arguments(tool), f"\n```{CALL_END}")
             for tool in tools]
    return _section(calls, parallel, separator="\n")  # V3's templates put a newline between calls


def v31_call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    calls = [tag(f"{CALL_BEGIN}{tool.name}{SEPARATOR}", json_arguments(tool), CALL_END) for tool in tools]
    return _section(calls, parallel)


def _section(calls: list[Format], parallel: bool, separator: str = "") -> Format:
    section = tag(SECTION_BEGIN, calls_in_a_row(calls, parallel, separator), SECTION_END)
    return triggered([SECTION_BEGIN], [section], parallel)
