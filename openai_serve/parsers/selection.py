"""Which parsers a chat request's answers go through: decided once per request, one parser per choice.

A forced `tool_choice` (required, named) is read by the forced parsers, since structured output shaped
the answer (and thinking is not split then: the answer is JSON from its first token). `auto` uses
the server's tool-call parser; `none` no tool parser. The reasoning parser, when the server has one,
runs first and hands the tool parser only the content.
"""

from dataclasses import dataclass

from openai_serve.parsers.forced import NamedToolParser, RequiredToolParser
from openai_serve.parsers.message import MessageParser
from openai_serve.parsers.reasoning import ReasoningParser
from openai_serve.parsers.tool_parsers import PARSERS, FirstCallOnly, ToolCallParser, parser_name_for_template
from openai_serve.protocol.tools import ToolChoice, ToolRequest


def resolve_tool_call_parser(setting: str, template: str | None) -> str | None:
    """`--tool-call-parser` as a parser name, or None for no parsing."""
    if setting == "auto":
        return parser_name_for_template(template)
    return None if setting == "none" else setting


@dataclass(frozen=True)
class OutputParsing:
    tools: ToolRequest
    tool_call_parser: str | None  # resolved: a name in PARSERS, or None
    reasoning_parser: str | None
    prompt: str  # the rendered prompt: where it ends tells where thinking starts

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning_parser is not None and not self.tools.is_forced

    def new_parser(self) -> MessageParser | None:
        """A parser for one choice's answer; None when its text is all content."""
        tools = self._tool_parser()
        reasoning = ReasoningParser(self.reasoning_parser, self.prompt) if self.has_reasoning else None  # type: ignore[arg-type]
        if tools is None and reasoning is None:
            return None
        return MessageParser(reasoning, tools)

    def _tool_parser(self) -> ToolCallParser | None:
        choice = self.tools.choice
        if choice is ToolChoice.NAMED:
            return NamedToolParser(self.tools.named)  # type: ignore[arg-type]
        if choice is ToolChoice.REQUIRED:
            return RequiredToolParser()
        if choice is not ToolChoice.AUTO or self.tool_call_parser is None:
            return None
        parser = PARSERS[self.tool_call_parser]()
        return parser if self.tools.parallel_tool_calls else FirstCallOnly(parser)
