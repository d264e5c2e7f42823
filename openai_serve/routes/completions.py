"""POST /v1/completions: the legacy text completions endpoint, streamed or in full.

Streaming follows OpenAI: every chunk has the response's one `id`; a choice's last chunk carries
its `finish_reason` (with empty text); with `stream_options.include_usage` every chunk has
`usage: null` (the usage so far with vLLM's `continuous_usage_stats`) and a last chunk with
`choices: []` has the usage; then `data: [DONE]`.
With `echo`, each choice starts with its prompt's text (its first chunk, when streamed).
"""

import time
import uuid
from collections.abc import AsyncIterator
from functools import cached_property

from starlette.requests import Request
from starlette.responses import Response

from openai_serve.generation import CollectedChoice, Generation, Usage, with_usage_so_far
from openai_serve.ignored_fields import name_ignored_fields
from openai_serve.logprobs import TokenLogprob, completion_logprobs, echo_logprobs, prompt_logprobs_json
from openai_serve.protocol.completions import CompletionRequest, Prompt, parse_completion_request
from openai_serve.routes.responding import read_body, respond
from openai_serve.sse import Batch
from openai_serve.state import ServingState, serving_state


async def create_completion(request: Request) -> Response:
    state = serving_state(request)
    body = await read_body(request, "prompt", parse_completion_request)
    state.limits.check_generation(len(body.prompts), body.common, body.prompt_param)
    texts = [prompt for prompt in body.prompts if isinstance(prompt, str)]
    for text in texts:
        state.limits.check_text(len(text), body.prompt_param)
    prompts = await state.cpu_work.run(sum(map(len, texts)), lambda: [
        _tokenize(state, prompt, body.add_special_tokens) for prompt in body.prompts])
    view = CompletionView(state, body, prompts)
    response = await respond(request, state, body, view, prompts)
    return name_ignored_fields(response, body.ignored_fields)


def _tokenize(state: ServingState, prompt: Prompt, add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, str):
        return state.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    return list(prompt)


class CompletionView:
    """Builds this response's JSON: chunks while streaming, or the whole response."""

    def __init__(self, state: ServingState, body: CompletionRequest, prompts: list[list[int]]) -> None:
        self.response_id = f"cmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = body.common.model
        self._n = body.common.n
        self._include_usage = body.common.stream.include_usage
        self._continuous_usage = body.common.stream.continuous_usage_stats
        self._wants_logprobs = body.logprobs is not None
        self._state, self._body, self._prompts = state, body, prompts
        self._texts = state.token_texts

    @cached_property
    def _echo_texts(self) -> list[str]:
        """Each prompt's text for `echo`: read only once the prompts passed the engine's checks."""
        if not self._body.echo:
            return []
        skip = self._body.common.sampling.skip_special_tokens
        decode = self._state.tokenizer.decode
        return [p if isinstance(p, str) else decode(ids, skip_special_tokens=skip)
                for p, ids in zip(self._body.prompts, self._prompts, strict=True)]

    async def stream(self, generation: Generation) -> AsyncIterator[Batch]:
        if self._echo_texts:
            echoes = [self._chunk([self._choice(index, self._echo_texts[index // self._n], None, None)])
                      for index in range(len(generation.decoders))]
            yield with_usage_so_far(echoes, generation) if self._continuous_usage else echoes
        async for deltas in generation.batches():
            chunks = []
            for delta in deltas:
                if delta.text or delta.logprobs:
                    chunks.append(self._chunk([self._choice(delta.index, delta.text, delta.logprobs, None)]))
                if delta.finish_reason is not None:
                    chunks.append(self._chunk([self._choice(delta.index, "", None, delta.finish_reason)]))
            if self._include_usage and generation.is_finished:
                chunks.append({**self._chunk([]), "usage": generation.usage().to_dict()})
            yield with_usage_so_far(chunks, generation) if self._continuous_usage else chunks

    def response(self, choices: dict[int, CollectedChoice], usage: Usage) -> dict[str, object]:
        items = []
        for index, choice in sorted(choices.items()):
            echo = self._echo_texts[index // self._n] if self._echo_texts else ""
            item = self._choice(index, echo + choice.text, choice.logprobs, choice.finish_reason)
            prompt = self._prompts[index // self._n]
            if self._body.echo and self._wants_logprobs and choice.prompt_logprobs is not None:
                item["logprobs"] = echo_logprobs(prompt, choice.prompt_logprobs, self._prompt_offsets(prompt, echo),
                                                 choice.logprobs, self._texts)
            if self._body.prompt_logprobs is not None and choice.prompt_logprobs is not None:
                item["prompt_logprobs"] = prompt_logprobs_json(prompt, choice.prompt_logprobs, self._texts)
            items.append(item)
        return {**self._head(), "choices": items, "usage": usage.to_dict()}

    def _prompt_offsets(self, prompt: list[int], echo: str) -> list[int]:
        """Where each prompt token's text starts in the echoed text, and its length last."""
        skip = self._body.common.sampling.skip_special_tokens
        decode = self._state.tokenizer.decode
        return [len(decode(prompt[:i], skip_special_tokens=skip)) for i in range(len(prompt))] + [len(echo)]

    def _head(self) -> dict[str, object]:
        return {"id": self.response_id, "object": "text_completion", "created": self._created,
                "model": self._model, "system_fingerprint": None}

    def _chunk(self, choices: list[dict[str, object]]) -> dict[str, object]:
        chunk = {**self._head(), "choices": choices}
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def _choice(
        self, index: int, text: str, logprobs: list[TokenLogprob] | None, finish_reason: str | None
    ) -> dict[str, object]:
        formatted = None
        if self._wants_logprobs and logprobs is not None:
            formatted = completion_logprobs(logprobs, self._texts)
        return {"index": index, "text": text, "logprobs": formatted, "finish_reason": finish_reason}
