"""`qwen3_coder`: Qwen3-Coder, Qwen3.5 and Qwen3.6 write each call as
`<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`, a
value as plain text (a string as it is, a number or an object as JSON), typed here by the tool's
schema. A `<function=...>` without the `<tool_call>` around it (some of these models drop it) is a
call too. The chat templates that show this format say `<function=` where they teach it.
"""

import regex

from openai_serve.parsers.tool_call_grammar import MAX_WHITESPACE, Format, tag, triggered
from openai_serve.parsers.xml_calls import XmlCallsParser, XmlSyntax
from openai_serve.protocol.tools import Tool

TEMPLATE_MARK = "<function="
TRIGGER = "<tool_call>"

SYNTAX = XmlSyntax(
    begins=(TRIGGER, "<function="),
    head=regex.compile(r"(?:<tool_call>\s*)?<function=(?P<name>[^>\n<]+)>(?=\s*(?:<parameter=|</function>))"),
    parameter=regex.compile(r"\s*<parameter=(?P<key>[^>\n<]+)>(?P<value>.*?)</parameter>", regex.DOTALL),
    parameter_opening="<parameter=",
    value_end="</parameter>",
    end=regex.compile(r"\s*</function>"),
    closing="</function>",
    trailer="</tool_call>",
    strip_newline=True,
)


def new_parser(tools: tuple[Tool, ...]) -> XmlCallsParser:
    return XmlCallsParser(SYNTAX, tools)


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    tags = [tag(f"{TRIGGER}\n<function={tool.name}>\n", _xml_arguments(tool), "</function>\n</tool_call>")
            for tool in tools]
    return triggered([TRIGGER], tags, parallel)


def _xml_arguments(tool: Tool) -> Format:
    return {"type": "json_schema", "json_schema": tool.parameters, "style": "qwen_xml",
            "max_whitespace_cnt": MAX_WHITESPACE}
