"""One response of the Responses API while it is made and after: its status, output items, usage,
the response object as it stands, and its stream of events.

Status: `in_progress` while the engine writes it; then `completed`, `incomplete` (cut off by
`max_output_tokens` or the context: `incomplete_details.reason` is `max_output_tokens`), `failed`
(the engine went away: server shutdown or engine failure; `error` says why) or `cancelled` (a
background response cancelled). Usage counts as chat's does; `output_tokens_details.reasoning_tokens`
are the tokens generated before anything but reasoning was written, counted per engine step.
"""

import time
from collections.abc import AsyncIterator

from openai_serve.answer_items import delta_parts
from openai_serve.choice import ChoiceDelta
from openai_serve.errors import APIError
from openai_serve.generation import Generation
from openai_serve.logprobs import TokenTexts, chat_logprobs
from openai_serve.parsers.message import MessageParser
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.fields import UnknownFields
from openai_serve.protocol.response_input import parse_input
from openai_serve.protocol.responses import ResponsesRequest
from openai_serve.response_output import Event, OutputItems, new_item_id
from openai_serve.sse import Batch

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


class ResponseRun:
    def __init__(self, body: ResponsesRequest, parsing: OutputParsing, texts: TokenTexts) -> None:
        self.response_id = new_item_id("resp")
        self.body = body
        self.status = "in_progress"
        self.items = OutputItems()
        self._created_at = int(time.time())
        self._completed_at: int | None = None
        self._parsing = parsing
        self._texts = texts if body.logprobs is not None else None
        self._usage: dict[str, object] | None = None
        self._error: dict[str, object] | None = None
        self._num_reasoning_tokens = 0
        self._num_events = 0

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL

    def response(self) -> dict[str, object]:
        """The response object as things stand (its output so far while in progress)."""
        is_cut_off = self.status == "incomplete"
        return {
            "id": self.response_id, "object": "response", "created_at": self._created_at, "status": self.status,
            "completed_at": self._completed_at, "error": self._error,
            "incomplete_details": {"reason": "max_output_tokens"} if is_cut_off else None,
            "model": self.body.common.model, "output": self.items.snapshot(), "usage": self._usage,
            **self.body.settings,
        }

    def conversation(self) -> tuple[dict[str, object], ...]:
        """The messages a response continuing this one starts from: this one's (without its
        instructions), then its output as the assistant's turn."""
        output = self.items.snapshot()
        answer = parse_input(output, UnknownFields(is_strict=True)) if output else ()
        return (*self.body.conversation, *answer)

    async def events(self, generation: Generation) -> AsyncIterator[Batch]:
        """Every event of the response, one batch per wake-up, the terminal one last. An engine that
        goes away raises (APIError) out of here: `fail` then gives the last events."""
        yield self._numbered([{"type": "response.created", "response": self.response()},
                              {"type": "response.in_progress", "response": self.response()}])
        parser = self._parsing.new_parser()
        async for deltas in generation.batches():
            events: list[Event] = []
            for delta in deltas:  # one choice: one delta per wake-up
                events += self._absorb(parser, delta, generation)
            yield self._numbered(events)

    def fail(self, error: APIError, usage: dict[str, object] | None = None) -> Batch:
        events = self.items.abandon()
        self.status, self._usage = "failed", usage
        self._error = {"code": "server_error", "message": error.message}
        self._completed_at = int(time.time())
        return self._numbered([*events, {"type": "response.failed", "response": self.response()}])

    def cancel(self) -> None:
        self.items.abandon()
        self.status = "cancelled"
        self._completed_at = int(time.time())

    def _absorb(self, parser: MessageParser | None, delta: ChoiceDelta, generation: Generation) -> list[Event]:
        logprobs = None if self._texts is None else chat_logprobs(delta.logprobs, self._texts)["content"]
        events = self.items.add(delta_parts(delta, parser), logprobs)  # type: ignore[arg-type]
        if self._parsing.has_reasoning and not self.items.has_answer:
            self._num_reasoning_tokens = len(generation.decoders[0].tracker.token_ids)
        if delta.finish_reason is not None:
            events += self._end(delta.finish_reason == "length", generation)
        return events

    def _end(self, is_cut_off: bool, generation: Generation) -> list[Event]:
        events = self.items.finish(is_cut_off)
        self.status = "incomplete" if is_cut_off else "completed"
        self._usage = usage_json(generation, self._num_reasoning_tokens)
        self._completed_at = int(time.time())
        return [*events, {"type": f"response.{self.status}", "response": self.response()}]

    def _numbered(self, events: list[Event]) -> Batch:
        for event in events:
            event["sequence_number"] = self._num_events
            self._num_events += 1
        return events


def usage_json(generation: Generation, num_reasoning_tokens: int = 0) -> dict[str, object]:
    usage = generation.usage()
    return {
        "input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }
