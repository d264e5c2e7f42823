"""The content blocks of one Anthropic message, built from the parts of its answer as the parsers hand
them out (parsers/deltas.py), each change also as an event of Anthropic's stream.

Blocks come in the order the model wrote them: `thinking` (with --reasoning-parser), `text`, then a
`tool_use` per call (the sequence of answer_items.py), so a block is started, grows by deltas, then
stops:

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

from openai_serve.answer_items import CALL, CONTENT, REASONING, AnswerItems, Event, OpenItem
from openai_serve.parsers.deltas import ToolCallDelta

_DELTAS = {REASONING: ("thinking_delta", "thinking"), CONTENT: ("text_delta", "text"),
           CALL: ("input_json_delta", "partial_json")}


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def thinking_signature(thinking: str) -> str:
    return hashlib.blake2b(thinking.encode(), digest_size=32).hexdigest()


class ContentBlocks(AnswerItems):
    def __init__(self, shows_thinking: bool = True) -> None:
        """`shows_thinking`: False sends thinking blocks without their text (`thinking.display: omitted`)."""
        super().__init__()
        self._shows_thinking = shows_thinking

    @property
    def has_tool_use(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.items) or (
            self._open is not None and self._open.kind == CALL)

    def finish(self) -> list[Event]:
        """Closes the open block."""
        return self._close()

    def _grown(self, block: OpenItem, text: str, logprobs: list[dict[str, object]]) -> list[Event]:
        if block.kind == REASONING and not self._shows_thinking:
            return []
        kind, key = _DELTAS[block.kind]
        return [{"type": "content_block_delta", "index": block.index, "delta": {"type": kind, key: text}}]

    def _start(self, kind: str, call: ToolCallDelta | None = None) -> list[Event]:
        start: dict[str, object]
        if call is not None:
            start = {"type": "tool_use", "id": new_tool_use_id(), "name": call.name, "input": {}}
        elif kind == REASONING:
            start = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            start = {"type": "text", "text": ""}
        self._open = OpenItem(kind, len(self.items), start, call_index=None if call is None else call.index)
        return [{"type": "content_block_start", "index": self._open.index, "content_block": start}]

    def _close(self) -> list[Event]:
        block, self._open = self._open, None
        if block is None:
            return []
        full = _full_block(block)
        self.items.append(full if self._shows_thinking or block.kind != REASONING else {**full, "thinking": ""})
        events: list[Event] = []
        if block.kind == REASONING:
            delta = {"type": "signature_delta", "signature": full["signature"]}
            events.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        return [*events, {"type": "content_block_stop", "index": block.index}]


def _full_block(block: OpenItem) -> dict[str, object]:
    if block.kind == CALL:
        return {**block.start, "input": _arguments(block.text)}
    if block.kind == REASONING:
        return {"type": "thinking", "thinking": block.text, "signature": thinking_signature(block.text)}
    return {"type": "text", "text": block.text}


def _arguments(text: str) -> dict[str, object]:
    """A call's arguments as an object; `{}` where they are not one (cut off, or empty)."""
    try:
        arguments = json.loads(text)
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}
