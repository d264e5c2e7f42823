"""One choice's answer taken apart: reasoning first (when a reasoning parser is on), then tool calls
in what is left (when the request has tools to parse for)."""

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.reasoning import ReasoningParser
from openai_serve.parsers.tool_parsers import ToolCallParser


class MessageParser:
    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self.has_tool_calls = False

    def feed(self, text: str) -> list[MessageDelta]:
        if self._reasoning is None:
            return self._parse_content([MessageDelta(content=text)])
        return self._parse_content(self._reasoning.feed(text))

    def finish(self) -> list[MessageDelta]:
        deltas = [] if self._reasoning is None else self._parse_content(self._reasoning.finish())
        if self._tools is not None:
            deltas += self._mark(self._tools.finish())
        return deltas

    def _parse_content(self, deltas: list[MessageDelta]) -> list[MessageDelta]:
        if self._tools is None:
            return deltas
        parsed = []
        for delta in deltas:
            parsed += self._tools.feed(delta.content) if delta.content else [delta]
        return self._mark(parsed)

    def _mark(self, deltas: list[MessageDelta]) -> list[MessageDelta]:
        self.has_tool_calls = self.has_tool_calls or any(d.tool_call is not None for d in deltas)
        return deltas
