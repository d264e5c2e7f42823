"""`glm45`: GLM-4.5, 4.6 and 4.7 write each call as
`<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>` (4.7 without the
newlines), a value as plain text (a string as it is, anything else as JSON), typed here by the
tool's schema. The chat templates that show this format say `<arg_key>` where they teach it.
"""

import regex

from openai_serve.parsers.tool_call_grammar import MAX_WHITESPACE, Format, tag, triggered
from openai_serve.parsers.xml_calls import XmlCallsParser, XmlSyntax
from openai_serve.protocol.tools import Tool

TEMPLATE_MARK = "<arg_key>"
TRIGGER = "<tool_call>"

SYNTAX = XmlSyntax(
    begins=(TRIGGER,),
    head=regex.compile(r"<tool_call>(?P<name>[^\n<]+?)(?=\s*(?:<arg_key>|</tool_call>))"),
    parameter=regex.compile(r"\s*<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>",
                            regex.DOTALL),
    parameter_opening="<arg_key>",
    value_end="</arg_value>",
    end=regex.compile(r"\s*</tool_call>"),
    closing="</tool_call>",
)


def new_parser(tools: tuple[Tool, ...]) -> XmlCallsParser:
    return XmlCallsParser(SYNTAX, tools)


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    tags = [tag(f"{TRIGGER}{tool.name}", _xml_arguments(tool), "</tool_call>") for tool in tools]
    return triggered([TRIGGER], tags, parallel)


def _xml_arguments(tool: Tool) -> Format:
    return {"type": "json_schema", "json_schema": tool.parameters, "style": "glm_xml",
            "max_whitespace_cnt": MAX_WHITESPACE}
