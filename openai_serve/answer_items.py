"""An answer's parts (parsers/deltas.py) as a sequence of items, in the order the model wrote them:
reasoning, content, then one item per tool call. What the Responses API calls output items
(response_output.py) and Anthropic's Messages API content blocks (anthropic_blocks.py) are this one
sequence, each API saying how an item starts, grows and ends as its stream's events.

A part of another kind than the open item's closes it and opens the next, so an item is started,
grows by pieces of text (or of a call's arguments), then ends. A call's first delta (with its name)
starts its item; arguments of a call already closed cannot come: parsers finish calls in order.
"""

from dataclasses import dataclass, field

from openai_serve.choice import ChoiceDelta
from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta
from openai_serve.parsers.message import MessageParser

Event = dict[str, object]
REASONING, CONTENT, CALL = "reasoning", "content", "call"


def delta_parts(delta: ChoiceDelta, parser: MessageParser | None) -> list[MessageDelta]:
    """One choice delta's parts: its text through the choice's parser (finished by the choice's last
    delta), or all of it content where the answer has no parser."""
    if parser is None:
        return [MessageDelta(content=delta.text)] if delta.text else []
    parts = parser.feed(delta.text) if delta.text else []
    return parts + parser.finish() if delta.finish_reason is not None else parts


@dataclass
class OpenItem:
    kind: str  # REASONING, CONTENT or CALL
    index: int  # its place among the answer's items
    start: dict[str, object]  # the item as it was started
    pieces: list[str] = field(default_factory=list)  # its text (or the call's arguments) so far
    logprobs: list[dict[str, object]] = field(default_factory=list)  # of its text, where asked for
    call_index: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class AnswerItems:
    def __init__(self) -> None:
        self.items: list[dict[str, object]] = []  # the finished items, in order
        self._open: OpenItem | None = None

    def add(self, parts: list[MessageDelta], logprobs: list[dict[str, object]] | None = None) -> list[Event]:
        """The events for one wake-up's parts; `logprobs` go with its text (plain answers only)."""
        events: list[Event] = []
        for part in parts:
            if part.reasoning:
                events += self._grow(REASONING, part.reasoning)
            if part.content:
                events += self._grow(CONTENT, part.content, logprobs)
                logprobs = None
            if part.tool_call is not None:
                events += self._call(part.tool_call)
        return events

    def _grow(self, kind: str, text: str, logprobs: list[dict[str, object]] | None = None) -> list[Event]:
        events = [] if self._open is not None and self._open.kind == kind else [*self._close(), *self._start(kind)]
        item = self._open
        assert item is not None
        item.pieces.append(text)
        item.logprobs += logprobs or []
        return [*events, *self._grown(item, text, logprobs or [])]

    def _call(self, call: ToolCallDelta) -> list[Event]:
        events = [*self._close(), *self._start(CALL, call)] if call.name is not None else []
        item = self._open
        if item is None or item.call_index != call.index or not call.arguments:
            return events
        item.pieces.append(call.arguments)
        return [*events, *self._grown(item, call.arguments, [])]

    def _start(self, kind: str, call: ToolCallDelta | None = None) -> list[Event]:
        """Opens an item of this kind (`call`: a call's first delta) as `self._open`; its events."""
        raise NotImplementedError

    def _grown(self, item: OpenItem, text: str, logprobs: list[dict[str, object]]) -> list[Event]:
        """The events of a piece added to the open item."""
        raise NotImplementedError

    def _close(self) -> list[Event]:
        """Ends the open item, if any, into `self.items`; its events."""
        raise NotImplementedError
