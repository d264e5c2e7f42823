"""The output items of one response, built from the parts of its answer as the parsers hand them out
(parsers/deltas.py), each change also as an event of OpenAI's Responses stream.

Items come in the order the model wrote them: a `reasoning` item (with --reasoning-parser; its
text in `content`, as vLLM gives it, and an empty `summary`), a `message` with one `output_text`
part, then a `function_call` item per call (the sequence of answer_items.py), so an item is added,
grows by deltas, then is done:

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

from openai_serve.answer_items import CALL, CONTENT, REASONING, AnswerItems, Event, OpenItem
from openai_serve.parsers.deltas import ToolCallDelta

_TYPES = {REASONING: "reasoning", CONTENT: "message", CALL: "function_call"}
_TEXT_KIND = {REASONING: "reasoning_text", CONTENT: "output_text"}


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems(AnswerItems):
    @property
    def has_answer(self) -> bool:
        """Whether anything other than reasoning has been written."""
        kinds = [item["type"] for item in self.items] + ([_TYPES[self._open.kind]] if self._open else [])
        return any(kind != "reasoning" for kind in kinds)

    def finish(self, is_cut_off: bool) -> list[Event]:
        """Closes the open item; an answer with no item at all gets an empty message."""
        events = self._start(CONTENT) if self._open is None and not self.items else []
        return [*events, *self._close("incomplete" if is_cut_off else "completed")]

    def abandon(self) -> list[Event]:
        """Closes the open item as `incomplete` (the response failed or was cancelled)."""
        return self._close("incomplete")

    def snapshot(self) -> list[dict[str, object]]:
        """Every item as it is now, the open one as far as it goes (for a response that failed)."""
        if self._open is None:
            return list(self.items)
        return [*self.items, _full_item(self._open, "incomplete")]

    def _grown(self, item: OpenItem, text: str, logprobs: list[dict[str, object]]) -> list[Event]:
        if item.kind == CALL:
            return [{"type": "response.function_call_arguments.delta", **_where(item), "delta": text}]
        event: Event = {"type": f"response.{_TEXT_KIND[item.kind]}.delta", **_where(item), "content_index": 0,
                        "delta": text}
        if item.kind == CONTENT:
            event["logprobs"] = logprobs
        return [event]

    def _start(self, kind: str, call: ToolCallDelta | None = None) -> list[Event]:
        output_index = len(self.items)
        if call is not None:
            item: dict[str, object] = {"id": new_item_id("fc"), "type": "function_call", "status": "in_progress",
                                       "call_id": call.id, "name": call.name, "arguments": ""}
        elif kind == CONTENT:
            item = {"id": new_item_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
        else:
            item = {"id": new_item_id("rs"), "type": "reasoning", "status": "in_progress", "summary": []}
        self._open = OpenItem(kind, output_index, item, call_index=None if call is None else call.index)
        events: list[Event] = [{"type": "response.output_item.added", "output_index": output_index, "item": item}]
        if call is None:
            events.append({"type": "response.content_part.added", **_where(self._open), "content_index": 0,
                           "part": _part(kind, "", [])})
        return events

    def _close(self, status: str = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        full = _full_item(item, status)
        self.items.append(full)
        if item.kind == CALL:
            events: list[Event] = [{"type": "response.function_call_arguments.done", **_where(item),
                                    "arguments": item.text}]
        else:
            done: Event = {"type": f"response.{_TEXT_KIND[item.kind]}.done", **_where(item), "content_index": 0,
                           "text": item.text}
            if item.kind == CONTENT:
                done["logprobs"] = item.logprobs
            part = {"type": "response.content_part.done", **_where(item), "content_index": 0,
                    "part": _part(item.kind, item.text, item.logprobs)}
            events = [done, part]
        return [*events, {"type": "response.output_item.done", "output_index": item.index, "item": full}]


def _full_item(item: OpenItem, status: str) -> dict[str, object]:
    full = {**item.start, "status": status}
    if item.kind == CALL:
        full["arguments"] = item.text
    else:
        full["content"] = [_part(item.kind, item.text, item.logprobs)]
    return full


def _where(item: OpenItem) -> dict[str, object]:
    return {"item_id": item.start["id"], "output_index": item.index}


def _part(kind: str, text: str, logprobs: list[dict[str, object]]) -> dict[str, object]:
    if kind == REASONING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
