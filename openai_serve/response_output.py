"""The output items of one response, built from the parts of its answer as the parsers hand them out
(parsers/deltas.py), each change also as an event of OpenAI's Responses stream.

Items come in the order the model wrote them: a `reasoning` item (with --reasoning-parser; its
text in `content`, as vLLM gives it, and an empty `summary`), a `message` with one `output_text`
part, then a `function_call` item per call. A part of another kind closes the open item and opens
the next, so an item is added, grows by deltas, then is done:

  reasoning: output_item.added, content_part.added, reasoning_text.delta..., reasoning_text.done,
             content_part.done, output_item.done
  message:   output_item.added, content_part.added, output_text.delta..., output_text.done,
             content_part.done, output_item.done
  call:      output_item.added (name, call_id), function_call_arguments.delta...,
             function_call_arguments.done, output_item.done

A response in full is these same items, so a stream and the response always agree. Events carry no
`sequence_number` here: the stream numbers them as it sends them. An item left open when the answer
ends is `incomplete` if the answer was cut off.
"""

import uuid
from dataclasses import dataclass, field

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta

Event = dict[str, object]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class _OpenItem:
    kind: str  # "reasoning", "message" or "function_call"
    item: dict[str, object]  # as output_item.added showed it
    output_index: int
    pieces: list[str] = field(default_factory=list)  # its text (or arguments) so far
    logprobs: list[dict[str, object]] = field(default_factory=list)
    call_index: int | None = None


class OutputItems:
    def __init__(self) -> None:
        self.items: list[dict[str, object]] = []  # the finished items, in order
        self._open: _OpenItem | None = None

    @property
    def has_answer(self) -> bool:
        """Whether anything other than reasoning has been written."""
        kinds = [item["type"] for item in self.items] + ([self._open.kind] if self._open else [])
        return any(kind != "reasoning" for kind in kinds)

    def add(self, parts: list[MessageDelta], logprobs: list[dict[str, object]] | None = None) -> list[Event]:
        """The events for one wake-up's parts; `logprobs` go with its text (plain answers only)."""
        events: list[Event] = []
        for part in parts:
            if part.reasoning:
                events += self._grow("reasoning", part.reasoning)
            if part.content:
                events += self._grow("message", part.content, logprobs)
                logprobs = None
            if part.tool_call is not None:
                events += self._call(part.tool_call)
        return events

    def finish(self, is_cut_off: bool) -> list[Event]:
        """Closes the open item; an answer with no item at all gets an empty message."""
        events = self._open_item("message") if self._open is None and not self.items else []
        return [*events, *self._close("incomplete" if is_cut_off else "completed")]

    def abandon(self) -> list[Event]:
        """Closes the open item as `incomplete` (the response failed or was cancelled)."""
        return self._close("incomplete")

    def snapshot(self) -> list[dict[str, object]]:
        """Every item as it is now, the open one as far as it goes (for a response that failed)."""
        if self._open is None:
            return list(self.items)
        return [*self.items, self._full_item(self._open, "incomplete")]

    def _grow(self, kind: str, text: str, logprobs: list[dict[str, object]] | None = None) -> list[Event]:
        events = [] if self._open is not None and self._open.kind == kind else [*self._close(), *self._open_item(kind)]
        item = self._open
        assert item is not None
        item.pieces.append(text)
        event: Event = {"type": f"response.{_TEXT_KIND[kind]}.delta", **_where(item), "content_index": 0,
                        "delta": text}
        if kind == "message":
            event["logprobs"] = logprobs or []
            item.logprobs += logprobs or []
        return [*events, event]

    def _call(self, call: ToolCallDelta) -> list[Event]:
        events = []
        if call.name is not None:  # a call's first delta
            events += self._close()
            events += self._open_item("function_call", call)
        item = self._open
        if item is None or item.call_index != call.index or not call.arguments:
            return events  # arguments of a call already closed cannot be: parsers finish calls in order
        item.pieces.append(call.arguments)
        return [*events, {"type": "response.function_call_arguments.delta", **_where(item), "delta": call.arguments}]

    def _open_item(self, kind: str, call: ToolCallDelta | None = None) -> list[Event]:
        output_index = len(self.items)
        if kind == "function_call":
            assert call is not None
            item: dict[str, object] = {"id": new_item_id("fc"), "type": kind, "status": "in_progress",
                                       "call_id": call.id, "name": call.name, "arguments": ""}
        elif kind == "message":
            item = {"id": new_item_id("msg"), "type": kind, "status": "in_progress", "role": "assistant",
                    "content": []}
        else:
            item = {"id": new_item_id("rs"), "type": kind, "status": "in_progress", "summary": []}
        self._open = _OpenItem(kind, item, output_index, call_index=None if call is None else call.index)
        events: list[Event] = [{"type": "response.output_item.added", "output_index": output_index, "item": item}]
        if kind != "function_call":
            events.append({"type": "response.content_part.added", **_where(self._open), "content_index": 0,
                           "part": _part(kind, "", [])})
        return events

    def _close(self, status: str = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        full = self._full_item(item, status)
        self.items.append(full)
        text = "".join(item.pieces)
        if item.kind == "function_call":
            events: list[Event] = [{"type": "response.function_call_arguments.done", **_where(item), "arguments": text}]
        else:
            done: Event = {"type": f"response.{_TEXT_KIND[item.kind]}.done", **_where(item), "content_index": 0,
                           "text": text}
            if item.kind == "message":
                done["logprobs"] = item.logprobs
            part = {"type": "response.content_part.done", **_where(item), "content_index": 0,
                    "part": _part(item.kind, text, item.logprobs)}
            events = [done, part]
        return [*events, {"type": "response.output_item.done", "output_index": item.output_index, "item": full}]

    @staticmethod
    def _full_item(item: _OpenItem, status: str) -> dict[str, object]:
        text = "".join(item.pieces)
        full = {**item.item, "status": status}
        if item.kind == "function_call":
            full["arguments"] = text
        else:
            full["content"] = [_part(item.kind, text, item.logprobs)]
        return full


_TEXT_KIND = {"reasoning": "reasoning_text", "message": "output_text"}


def _where(item: _OpenItem) -> dict[str, object]:
    return {"item_id": item.item["id"], "output_index": item.output_index}


def _part(kind: str, text: str, logprobs: list[dict[str, object]]) -> dict[str, object]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
