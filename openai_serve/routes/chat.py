"""POST /v1/chat/completions: chat through the model's chat template, streamed or in full.

Streaming follows OpenAI: every chunk has the response's one `id`; each choice opens with a delta
`{"role": "assistant", "content": ""}`, then content deltas, then a chunk with an empty delta and
its `finish_reason`; with `stream_options.include_usage` every chunk has `usage: null` and a last
chunk with `choices: []` has the usage; then `data: [DONE]`.
"""

import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from openai_serve.generation import CollectedChoice, Generation, Usage
from openai_serve.http_io import read_json
from openai_serve.logprobs import TokenLogprob, chat_logprobs
from openai_serve.protocol.chat import ChatRequest, parse_chat_request
from openai_serve.routes.responding import respond
from openai_serve.sse import Batch
from openai_serve.state import ServingState, serving_state


async def create_chat_completion(request: Request) -> Response:
    state = serving_state(request)
    body = parse_chat_request(await read_json(request))
    state.check_model(body.common.model)
    prompt = state.chat_template.tokenize(state.chat_template.render(body))
    view = ChatView(state, body)
    return await respond(request, state, body, view, [prompt])


class ChatView:
    """Builds this response's JSON: chunks while streaming, or the whole response."""

    def __init__(self, state: ServingState, body: ChatRequest) -> None:
        self.response_id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = body.common.model
        self._include_usage = body.common.stream.include_usage
        self._wants_logprobs = body.logprobs is not None
        self._texts = state.token_texts

    async def stream(self, generation: Generation) -> AsyncIterator[Batch]:
        yield [self._chunk(index, {"role": "assistant", "content": ""}, None, None)
               for index in range(len(generation.decoders))]
        async for deltas in generation.batches():
            chunks = []
            for delta in deltas:
                if delta.text or delta.logprobs:
                    chunks.append(self._chunk(delta.index, {"content": delta.text}, delta.logprobs, None))
                if delta.finish_reason is not None:
                    chunks.append(self._chunk(delta.index, {}, None, delta.finish_reason))
            if self._include_usage and generation.is_finished:
                chunks.append({**self._head("chat.completion.chunk"), "choices": [],
                               "usage": generation.usage().to_dict()})
            yield chunks

    def response(self, choices: dict[int, CollectedChoice], usage: Usage) -> dict[str, object]:
        items = [
            {
                "index": index,
                "message": {"role": "assistant", "content": choice.text, "refusal": None},
                "logprobs": self._logprobs(choice.logprobs),
                "finish_reason": choice.finish_reason,
            }
            for index, choice in sorted(choices.items())
        ]
        return {**self._head("chat.completion"), "choices": items, "usage": usage.to_dict()}

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
