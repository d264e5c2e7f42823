"""Parsers for answers that structured output forced into a shape, so no tags and no guessing:

- a named `tool_choice`: the whole answer is the arguments of that one function (vLLM's way);
- `tool_choice: "required"`: the answer is `[{"name": ..., "parameters": {...}}, ...]`, one element
  per call (vLLM's way), the schema allowing only the request's tools and their parameters.
"""

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta, new_tool_call_id
from openai_serve.parsers.json_calls import CallStream
from openai_serve.parsers.json_spans import JsonSpans


class NamedToolParser:
    def __init__(self, name: str) -> None:
        self._name = name
        self._spans = JsonSpans(max_depth=0)
        self._num_sent = 0
        self._is_started = False

    def feed(self, text: str) -> list[MessageDelta]:
        deltas = self._start()
        self._spans.feed(text)
        piece = self._piece()
        if piece:
            deltas.append(MessageDelta(tool_call=ToolCallDelta(0, arguments=piece)))
        return deltas

    def finish(self) -> list[MessageDelta]:
        return self._start()

    def _start(self) -> list[MessageDelta]:
        if self._is_started:
            return []
        self._is_started = True
        return [MessageDelta(tool_call=ToolCallDelta(0, new_tool_call_id(), self._name))]

    def _piece(self) -> str:
        """The answer's JSON value as far as it goes (whitespace around it is not part of it)."""
        text, span = self._spans.text, self._spans.spans.get(())
        if span is None:
            return ""
        end = len(text) if span.end is None else span.end
        piece = text[max(span.start, self._num_sent):end]
        self._num_sent = end
        return piece


class RequiredToolParser:
    def __init__(self) -> None:
        self._spans = JsonSpans(max_depth=2)
        self._calls: list[CallStream] = []

    def feed(self, text: str) -> list[MessageDelta]:
        self._spans.feed(text)
        while (len(self._calls),) in self._spans.spans:
            self._calls.append(CallStream(len(self._calls), self._spans, (len(self._calls),)))
        return [delta for call in self._calls for delta in call.update()]

    def finish(self) -> list[MessageDelta]:
        return []
