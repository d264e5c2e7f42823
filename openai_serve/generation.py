"""One HTTP request's choices in the engine: submitted together, decoded as outputs arrive, and
aborted together when the response ends early (disconnect, error, shutdown).

A choice that hits a stop string is aborted in the engine at once (by its tracker,
core/text_tracker.py), so its KV blocks are freed in the next step while the other choices go on.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from core import RequestRejected
from core.detokenizer import TokenDecoder
from core.outputs import TokenLogprobs
from core.request_checks import EngineLimits
from core.sampling_defaults import fill_max_tokens
from core.sampling_params import SamplingParams
from core.text_tracker import TokenLogprob
from openai_serve.choice import ChoiceDecoder, ChoiceDelta, ChoiceSpec, merge_deltas
from openai_serve.engine_bridge import EngineBridge, RequestHandle
from openai_serve.errors import refused
from openai_serve.protocol.common import CommonRequest, choice_params


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def to_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


class GenerationBody(Protocol):
    """What a generation endpoint's parsed request tells every choice."""

    common: CommonRequest
    prompt_param: str  # the client's names of the prompt and of max_tokens, for errors about them
    max_tokens_param: str


class Generation:
    def __init__(self, specs: list[ChoiceSpec], tokenizer: TokenDecoder,
                 on_end: "Callable[[Generation], None] | None" = None) -> None:
        """`on_end` runs once when a started generation ends, however it ends (logs, metrics)."""
        self.decoders = [ChoiceDecoder(spec, tokenizer, self._abort) for spec in specs]
        self._by_request_id = {d.spec.request_id: d for d in self.decoders}
        self._handle: RequestHandle | None = None
        self._on_end = on_end

    def start(self, bridge: EngineBridge) -> None:
        """Submits every choice (all or none)."""
        requests = [(d.spec.request_id, d.spec.prompt_token_ids, d.spec.params.for_engine()) for d in self.decoders]
        self._handle = bridge.submit(requests)

    async def batches(self) -> AsyncIterator[list[ChoiceDelta]]:
        """Text deltas of all choices as the engine makes them, one batch per wake-up: what arrived
        since the last one, merged per choice (see merge_deltas). Ends when every choice finished.

        A streaming consumer that falls behind the engine (a busy event loop, a slow client) then
        sends one chunk per choice for several steps instead of one per step, which is cheaper
        for both sides and lets it catch up; as vLLM does."""
        assert self._handle is not None, "start() first"
        num_unfinished = len(self.decoders)
        try:
            while num_unfinished:
                deltas = []
                for output in await self._handle.next_outputs():
                    delta = self._by_request_id[output.request_id].absorb(output)
                    if delta is not None:
                        num_unfinished -= delta.finish_reason is not None
                        deltas.append(delta)
                if deltas:
                    yield merge_deltas(deltas)
        finally:
            self.close()

    def _abort(self, request_id: str) -> None:
        """Aborts one choice in the engine (its tracker ended it at a stop string)."""
        if self._handle is not None:
            self._handle.abort(request_id)

    @property
    def is_finished(self) -> bool:
        return all(d.is_finished for d in self.decoders)

    def close(self) -> None:
        """Aborts every choice still running in the engine; safe to call more than once."""
        if self._handle is not None:
            self._handle.close()
            on_end, self._on_end = self._on_end, None
            if on_end is not None:
                on_end(self)

    def usage(self) -> Usage:
        """Each prompt counts once, however many choices it has (as OpenAI counts n > 1); its cached
        tokens are those every one of its choices found in the prefix cache."""
        by_prompt: dict[int, list[ChoiceDecoder]] = {}
        for decoder in self.decoders:
            by_prompt.setdefault(decoder.spec.prompt_index, []).append(decoder)
        groups = by_prompt.values()
        return Usage(
            prompt_tokens=sum(len(choices[0].spec.prompt_token_ids) for choices in groups),
            completion_tokens=sum(len(d.tracker.token_ids) for d in self.decoders),
            cached_tokens=sum(min(d.tracker.num_cached_prompt_tokens for d in choices) for choices in groups),
        )


def with_usage_so_far(chunks: list[dict[str, object]], generation: Generation) -> list[dict[str, object]]:
    """vLLM's `stream_options.continuous_usage_stats`: every chunk carries the usage up to it."""
    usage = generation.usage().to_dict()
    for chunk in chunks:
        chunk["usage"] = usage
    return chunks


@dataclass
class CollectedChoice:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # asked for: one per prompt token, the first None


async def collect(generation: Generation) -> dict[int, CollectedChoice]:
    """The whole of every choice, for a response that is not streamed."""
    choices = {d.spec.index: CollectedChoice() for d in generation.decoders}
    async for batch in generation.batches():
        for delta in batch:
            choice = choices[delta.index]
            choice.text += delta.text
            choice.logprobs += delta.logprobs
            choice.finish_reason = delta.finish_reason
    for decoder in generation.decoders:
        choices[decoder.spec.index].prompt_logprobs = decoder.tracker.prompt_logprobs
    return choices


def choice_specs(
    response_id: str, prompts: list[list[int]], body: GenerationBody, limits: EngineLimits, defaults: SamplingParams
) -> list[ChoiceSpec]:
    """n choices per prompt; choice j of prompt i is index i * n + j and engine request `{id}-{index}`.
    Each prompt is checked against the engine's limits once, errors naming the client's fields; a prompt
    whose request left max_tokens out gets the model's default (`defaults`) as far as its context allows."""
    n = body.common.n
    specs = []
    for prompt_index, prompt in enumerate(prompts):
        try:
            limits.check_prompt(prompt, body.prompt_param)
            sampling = fill_max_tokens(body.common.sampling, defaults, limits.max_model_len - len(prompt))
            params = limits.fit(len(prompt), sampling, body.max_tokens_param)
        except RequestRejected as exc:
            raise refused(exc) from exc
        for j in range(n):
            index = prompt_index * n + j
            specs.append(ChoiceSpec(index, prompt_index, f"{response_id}-{index}", prompt, choice_params(params, j)))
    return specs
