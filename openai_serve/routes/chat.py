"""POST /v1/chat/completions: chat through the model's chat template, streamed or in full.

Streaming follows OpenAI: every chunk has the response's one `id`; each choice opens with a delta
`{"role": "assistant", "content": ""}`, then content deltas, then a chunk with an empty delta and
its `finish_reason`; with `stream_options.include_usage` every chunk has `usage: null` (the usage so
far with vLLM's `continuous_usage_stats`) and a last chunk with `choices: []` has the usage; then
`data: [DONE]`. With a reasoning parser or tools, each
choice's text goes through its parser (parsers/), and deltas carry reasoning and tool calls too.
"""

import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from openai_serve.chat_output import delta_json, finish_reason, message_json
from openai_serve.chat_prompt import chat_prompt
from openai_serve.generation import CollectedChoice, Generation, Usage, with_usage_so_far
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.logprobs import TokenLogprob, chat_logprobs, prompt_logprobs_json
from openai_serve.parsers.deltas import fold
from openai_serve.parsers.message import MessageParser
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.chat import ChatRequest, parse_chat_request
from openai_serve.routes.responding import read_body, respond
from openai_serve.sse import Batch
from openai_serve.state import ServingState, serving_state


async def create_chat_completion(request: Request) -> Response:
    state = serving_state(request)
    body = await read_body(request, "messages", parse_chat_request)
    state.limits.check_generation(1, body.common, body.prompt_param)
    prompt = await chat_prompt(state, body)
    view = ChatView(state, body, prompt.parsing, prompt.token_ids)
    response = await respond(request, state, prompt.request, view, [prompt.token_ids])
    return name_ignored_fields(response, body.ignored_fields)


class ChatView:
    """Builds this response's JSON: chunks while streaming, or the whole response."""

    def __init__(self, state: ServingState, body: ChatRequest, parsing: OutputParsing, prompt: list[int]) -> None:
        self.response_id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = body.common.model
        self._include_usage = body.common.stream.include_usage
        self._continuous_usage = body.common.stream.continuous_usage_stats
        self._wants_logprobs = body.logprobs is not None
        self._texts = state.token_texts
        self._parsing = parsing
        self._prompt = prompt

    async def stream(self, generation: Generation) -> AsyncIterator[Batch]:
        num_choices = len(generation.decoders)
        parsers = [self._parsing.new_parser() for _ in range(num_choices)]
        opening = [self._chunk(index, {"role": "assistant", "content": ""}, None, None) for index in range(num_choices)]
        yield with_usage_so_far(opening, generation) if self._continuous_usage else opening
        async for deltas in generation.batches():
            chunks = []
            for delta in deltas:
                parser = parsers[delta.index]
                message = {"content": delta.text} if delta.text else {}
                if parser is not None:
                    message = self._parse(parser, delta.text, delta.finish_reason is not None)
                if message or delta.logprobs:
                    chunks.append(self._chunk(delta.index, message, delta.logprobs, None))
                if delta.finish_reason is not None:
                    reason = finish_reason(delta.finish_reason, parser is not None and parser.has_tool_calls)
                    chunks.append(self._chunk(delta.index, {}, None, reason))
            if self._include_usage and generation.is_finished:
                chunks.append({**self._head("chat.completion.chunk"), "choices": [],
                               "usage": generation.usage().to_dict()})
            yield with_usage_so_far(chunks, generation) if self._continuous_usage else chunks

    @staticmethod
    def _parse(parser: MessageParser, text: str, is_last: bool) -> dict[str, object]:
        parts = parser.feed(text) if text else []
        return delta_json(parts + parser.finish() if is_last else parts)

    def response(self, choices: dict[int, CollectedChoice], usage: Usage) -> dict[str, object]:
        items = [
            {
                "index": index,
                **self._message(choice),
                "logprobs": self._logprobs(choice.logprobs),
            }
            for index, choice in sorted(choices.items())
        ]
        response = {**self._head("chat.completion"), "choices": items, "usage": usage.to_dict()}
        if choices and (entries := choices[0].prompt_logprobs) is not None:  # vLLM's, once per response
            response["prompt_logprobs"] = prompt_logprobs_json(self._prompt, entries, self._texts)
        return response

    def _message(self, choice: CollectedChoice) -> dict[str, object]:
        parser = self._parsing.new_parser()
        if parser is None:
            message = {"role": "assistant", "content": choice.text, "refusal": None}
            return {"message": message, "finish_reason": choice.finish_reason}
        parsed = fold(parser.feed(choice.text) + parser.finish())
        return {"message": message_json(parsed, self._parsing.has_reasoning),
                "finish_reason": finish_reason(choice.finish_reason, parser.has_tool_calls)}

    def _head(self, kind: str) -> dict[str, object]:
        return {"id": self.response_id, "object": kind, "created": self._created, "model": self._model,
                "system_fingerprint": None}

    def _chunk(
        self, index: int, delta: dict[str, object], logprobs: list[TokenLogprob] | None, finish_reason: str | None
    ) -> dict[str, object]:
        choice = {"index": index, "delta": delta, "logprobs": self._logprobs(logprobs), "finish_reason": finish_reason}
        chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def _logprobs(self, logprobs: list[TokenLogprob] | None) -> dict[str, object] | None:
        if not self._wants_logprobs or logprobs is None:
            return None
        return chat_logprobs(logprobs, self._texts)
