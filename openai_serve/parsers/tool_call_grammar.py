"""The lazy grammars of `auto` tool choice: free text until the model opens a tool call with its
family's trigger, then a call that the tools' schemas hold (xgrammar's structural tags, built by each
format's module; llama3_json, whose calls are a whole answer, holds an answer that starts as calls to
them). A call cannot fail to parse or name a tool the request lacks, and its arguments validate; text
before, between and after calls is the model's own.

JSON inside a call may hold at most `MAX_WHITESPACE` whitespace characters in a row: small models
otherwise pad between tokens until max_tokens, and a cut-off call is lost.
"""

import json

from core.structured_output import StructuredOutput
from openai_serve.protocol.tools import Tool

MAX_WHITESPACE = 4
Format = dict[str, object]


def json_arguments(tool: Tool) -> Format:
    return {"type": "json_schema", "json_schema": tool.parameters, "max_whitespace_cnt": MAX_WHITESPACE}


def tag(begin: str, content: Format, end: str) -> Format:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def triggered(triggers: list[str], tags: list[Format], parallel: bool) -> Format:
    """Free text; where a trigger is written, one of `tags` (one call, or a section of calls) follows it."""
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags, "stop_after_first": not parallel}


def calls_in_a_row(tags: list[Format], parallel: bool, separator: str = "") -> Format:
    """One call, or (parallel) several one after another."""
    return {"type": "tags_with_separator", "tags": tags, "separator": separator, "at_least_one": True,
            "stop_after_first": not parallel}


def structural_tag(grammar: Format) -> StructuredOutput:
    return StructuredOutput(structural_tag=json.dumps({"type": "structural_tag", "format": grammar}),
                            param="tools")
