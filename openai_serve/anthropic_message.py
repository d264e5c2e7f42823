"""One answer of Anthropic's Messages API while it is made: its content blocks (anthropic_blocks.py),
stop reason and usage, the stream of events that builds it, and the message in full.

The stream, in Anthropic's order: `message_start` (the message with no content yet) and a `ping` at
once, the blocks' events, then `message_delta` (`stop_reason`, `stop_sequence`, the final usage) and
`message_stop`. A message in full is the one those events build. message_start's usage is what is
known before the engine starts: the whole prompt as `input_tokens`; message_delta's, which clients
take over it (its counts are cumulative), splits off the prefix cache's hits.

`stop_reason`: `end_turn`, `stop_sequence` (with the `stop_sequence` that matched), `tool_use` (an
answer that ended by itself in calls), `max_tokens`, or `model_context_window_exceeded` where the
answer ran into the end of the context before max_tokens. Usage as Anthropic counts it: the prompt's
tokens found in the prefix cache are `cache_read_input_tokens` and the others `input_tokens` (their
sum is the prompt); `cache_creation_input_tokens` is 0, as caching here is automatic and costs nothing.
"""

from collections.abc import AsyncIterator

from openai_serve.answer_items import delta_parts
from openai_serve.anthropic_blocks import ContentBlocks
from openai_serve.choice import ChoiceDelta
from openai_serve.errors import APIError
from openai_serve.generation import Generation
from openai_serve.parsers.message import MessageParser
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.anthropic_request import MessagesRequest
from openai_serve.response_output import new_item_id
from openai_serve.sse import Batch

Event = dict[str, object]


class MessageRun:
    def __init__(self, body: MessagesRequest, parsing: OutputParsing) -> None:
        self.message_id = new_item_id("msg")
        self.body = body
        self.blocks = ContentBlocks(body.shows_thinking)
        self._parsing = parsing
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None
        self._usage: dict[str, int] = {}

    def message(self) -> dict[str, object]:
        """The message as things stand: with its content, stop reason and usage once it ended."""
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.body.common.model,
                "content": list(self.blocks.items), "stop_reason": self._stop_reason,
                "stop_sequence": self._stop_sequence, "usage": self._usage}

    async def events(self, generation: Generation) -> AsyncIterator[Batch]:
        """Every event of the message, one batch per wake-up, `message_stop` last. An engine that goes
        away raises (APIError) out of here."""
        parser = self._parsing.new_parser()
        self._usage = usage_json(generation)
        yield [{"type": "message_start", "message": self.message()}, {"type": "ping"}]
        async for deltas in generation.batches():
            events: list[Event] = []
            for delta in deltas:  # one choice: one delta per wake-up
                events += self._absorb(parser, delta, generation)
            yield events

    def _absorb(self, parser: MessageParser | None, delta: ChoiceDelta, generation: Generation) -> list[Event]:
        events = self.blocks.add(delta_parts(delta, parser))
        if delta.finish_reason is not None:
            events += self._end(delta.finish_reason, generation)
        return events

    def _end(self, finish_reason: str, generation: Generation) -> list[Event]:
        events = self.blocks.finish()
        self._stop_sequence = generation.decoders[0].tracker.stop_string
        self._stop_reason = self._stop_reason_of(finish_reason, generation.usage().completion_tokens)
        self._usage = usage_json(generation)
        delta = {"stop_reason": self._stop_reason, "stop_sequence": self._stop_sequence}
        return [*events, {"type": "message_delta", "delta": delta, "usage": self._usage}, {"type": "message_stop"}]

    def _stop_reason_of(self, finish_reason: str, num_tokens: int) -> str:
        if finish_reason == "length":  # max_tokens, cut to what the context left when it was asked for more
            return "model_context_window_exceeded" if num_tokens < self.body.requested_max_tokens else "max_tokens"
        if self._stop_sequence is not None:
            return "stop_sequence"
        return "tool_use" if self.blocks.has_tool_use else "end_turn"


def usage_json(generation: Generation) -> dict[str, int]:
    usage = generation.usage()
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens, "output_tokens": usage.completion_tokens}


def error_event(error: APIError) -> Event:
    """An error after the stream began, as Anthropic streams it (the SDK raises it)."""
    return error.to_anthropic_dict()
