"""The content blocks of one Anthropic message, built from the parts of its answer as the parsers hand
them out (parsers/deltas.py), each change also as an event of Anthropic's stream.

Blocks come in the order the model wrote them: `thinking` (with --reasoning-parser), `text`, then a
`tool_use` per call. A part of another kind closes the open block and opens the next, so a block
is started, grows by deltas, then stops:

  thinking: content_block_start, thinking_delta..., signature_delta, content_block_stop
  text:     content_block_start, text_delta..., content_block_stop
  tool_use: content_block_start (id, name, input {}), input_json_delta..., content_block_stop

A message in full is these same blocks, so a stream and a message always agree. A tool_use's `input`
is its arguments parsed; arguments cut off before their JSON ended (the answer hit max_tokens) are
`{}` in full, while the stream has sent the pieces that came. Ids are Anthropic's shape
(`toolu_` and 24 hex digits). A thinking block's `signature` is a digest of its text: there is
nothing to encrypt on a local server, and one sent back is accepted as it is.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass, field

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta

Event = dict[str, object]
_DELTA_KINDS = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking"),
                "tool_use": ("input_json_delta", "partial_json")}


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def thinking_signature(thinking: str) -> str:
    return hashlib.blake2b(thinking.encode(), digest_size=32).hexdigest()


@dataclass
class _OpenBlock:
    kind: str  # "thinking", "text" or "tool_use"
    index: int
    start: dict[str, object]  # as content_block_start showed it
    pieces: list[str] = field(default_factory=list)  # its text (or the call's arguments) so far
    call_index: int | None = None


class ContentBlocks:
    def __init__(self, shows_thinking: bool = True) -> None:
        """`shows_thinking`: False sends thinking blocks without their text (`thinking.display: omitted`)."""
        self.blocks: list[dict[str, object]] = []  # the finished blocks, in order
        self._open: _OpenBlock | None = None
        self._shows_thinking = shows_thinking

    @property
    def has_tool_use(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.blocks) or (
            self._open is not None and self._open.kind == "tool_use")

    def add(self, parts: list[MessageDelta]) -> list[Event]:
        """The events for one wake-up's parts."""
        events: list[Event] = []
        for part in parts:
            if part.reasoning:
                events += self._grow("thinking", part.reasoning)
            if part.content:
                events += self._grow("text", part.content)
            if part.tool_call is not None:
                events += self._call(part.tool_call)
        return events

    def finish(self) -> list[Event]:
        """Closes the open block."""
        block, self._open = self._open, None
        if block is None:
            return []
        full = _full_block(block)
        self.blocks.append(full if self._shows_thinking or block.kind != "thinking" else {**full, "thinking": ""})
        events: list[Event] = []
        if block.kind == "thinking":
            delta = {"type": "signature_delta", "signature": full["signature"]}
            events.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        return [*events, {"type": "content_block_stop", "index": block.index}]

    def _grow(self, kind: str, text: str) -> list[Event]:
        events = [] if self._open is not None and self._open.kind == kind else [*self.finish(), *self._start(kind)]
        block = self._open
        assert block is not None
        block.pieces.append(text)
        if kind == "thinking" and not self._shows_thinking:
            return events
        return [*events, _delta(block, text)]

    def _call(self, call: ToolCallDelta) -> list[Event]:
        events = []
        if call.name is not None:  # a call's first delta
            events += self.finish()
            events += self._start("tool_use", call)
        block = self._open
        if block is None or block.call_index != call.index or not call.arguments:
            return events  # arguments of a call already closed cannot be: parsers finish calls in order
        block.pieces.append(call.arguments)
        return [*events, _delta(block, call.arguments)]

    def _start(self, kind: str, call: ToolCallDelta | None = None) -> list[Event]:
        start: dict[str, object]
        if call is not None:
            start = {"type": "tool_use", "id": new_tool_use_id(), "name": call.name, "input": {}}
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            start = {"type": "text", "text": ""}
        self._open = _OpenBlock(kind, len(self.blocks), start, call_index=None if call is None else call.index)
        return [{"type": "content_block_start", "index": self._open.index, "content_block": start}]


def _delta(block: _OpenBlock, text: str) -> Event:
    kind, key = _DELTA_KINDS[block.kind]
    return {"type": "content_block_delta", "index": block.index, "delta": {"type": kind, key: text}}


def _full_block(block: _OpenBlock) -> dict[str, object]:
    text = "".join(block.pieces)
    if block.kind == "tool_use":
        return {**block.start, "input": _arguments(text)}
    if block.kind == "thinking":
        return {"type": "thinking", "thinking": text, "signature": thinking_signature(text)}
    return {"type": "text", "text": text}


def _arguments(text: str) -> dict[str, object]:
    """A call's arguments as an object; `{}` where they are not one (cut off, or empty)."""
    try:
        arguments = json.loads(text)
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}
