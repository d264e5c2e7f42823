"""One tool call read out of a growing JSON object: `{"name": ..., "arguments": {...}}`.

The call's first delta (its id and name) goes out once the name is complete; its arguments then go
out in raw pieces as the model writes them (held back until the name is out, should a model write
them first). `parameters` is accepted for `arguments`, as Llama 3 writes it. Arguments written as a
JSON string of JSON (some models do) are sent decoded, in one piece once complete. A call object
that ends without arguments gets `{}`.
"""

import json
from collections.abc import Callable

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta, new_tool_call_id
from openai_serve.parsers.json_spans import JsonSpans, Path
from openai_serve.parsers.stepping import SteppingParser

ARGUMENT_KEYS = ("arguments", "parameters")


class CallStream:
    def __init__(
        self, index: int, spans: JsonSpans, path: Path = (), new_id: Callable[[], str] = new_tool_call_id
    ) -> None:
        self.index = index
        self._new_id = new_id
        self._spans = spans
        self._path = path  # where the call object lies in `spans`
        self.is_started = False  # its id and name went out
        self._num_sent = 0  # characters of the arguments' text sent so far
        self._is_complete = False

    def update(self) -> list[MessageDelta]:
        """What became known since the last update."""
        if self._is_complete:
            return []
        deltas = []
        if not self.is_started:
            name = self._name()
            if name is None:
                return []
            self.is_started = True
            deltas.append(ToolCallDelta(self.index, self._new_id(), name))
        piece = self._arguments_piece()
        if piece:
            deltas.append(ToolCallDelta(self.index, arguments=piece))
        return [MessageDelta(tool_call=d) for d in deltas]

    def _name(self) -> str | None:
        raw = self._spans.complete((*self._path, "name"))
        if raw is None:
            return None
        try:
            name = json.loads(raw)
        except json.JSONDecodeError:  # what the spans let through but JSON does not (a raw newline in it): no name
            return None
        return name if isinstance(name, str) else raw

    def _arguments_piece(self) -> str:
        spans = self._spans
        span = next((s for key in ARGUMENT_KEYS if (s := spans.spans.get((*self._path, key))) is not None), None)
        if span is None:
            if spans.complete(self._path) is None:
                return ""
            self._is_complete = True
            return "{}"
        end = span.end if span.end is not None else spans.position if spans.is_invalid else len(spans.text)
        if spans.text[span.start] == '"':  # arguments as a JSON string
            if span.end is None:
                return ""
            self._is_complete = True
            try:
                decoded = json.loads(spans.text[span.start:end])
            except json.JSONDecodeError:  # not a JSON string after all: the arguments as the model wrote them
                return spans.text[span.start:end]
            return decoded if isinstance(decoded, str) else ""
        piece = spans.text[span.start + self._num_sent:end]
        self._num_sent += len(piece)
        self._is_complete = span.end is not None
        return piece


class JsonCall:
    """A call written as a JSON object of its own (hermes' `<tool_call>` body, each of llama3_json's
    calls): its spans, fed the model's text, and the deltas they settle."""

    def __init__(self, index: int) -> None:
        self.spans = JsonSpans()
        self._stream = CallStream(index, self.spans)

    @property
    def is_started(self) -> bool:
        """Its id and name went out: it is a call (before that, its text may turn out to be content)."""
        return self._stream.is_started

    def feed(self, text: str) -> list[MessageDelta]:
        self.spans.feed(text)
        return self._stream.update()


class JsonCallsParser(SteppingParser):
    """A tool-call parser whose calls are JSON objects of their own, read one after another (hermes,
    llama3_json); each parser's own states say where a call starts and what follows it."""

    def __init__(self) -> None:
        super().__init__()
        self._num_calls = 0  # calls read in full
        self._call = JsonCall(0)  # the call being read (a fresh one from `_start_call`)

    def _start_call(self) -> None:
        self._call = JsonCall(self._num_calls)

    def _feed_call(self, deltas: list[MessageDelta]) -> JsonSpans:
        """Hands the pending text to the call being read (what follows its JSON stays in its spans' text)."""
        deltas.extend(self._call.feed(self._take_pending()))
        return self._call.spans
