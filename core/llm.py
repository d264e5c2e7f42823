"""Offline generation: `LLM(model).generate(prompts, params)` runs the engine to completion.

Prompts are strings (tokenized here: the engine knows token ids only) or lists of token ids; text
and stop strings come from the same tracker the server uses (core/text_tracker.py).
"""

from dataclasses import dataclass, field

import numpy as np

from core.config import engine_config
from core.engine import LLMEngine
from core.model_files import with_resolved_model
from core.outputs import FinishReason, TokenLogprobs
from core.pooling_output import embedding
from core.pooling_params import PoolingParams
from core.sampling_params import SamplingParams
from core.text_tracker import TextTracker
from core.tokenizer import load_tokenizer

Prompt = str | list[int]


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text: str = ""
    # With SamplingParams.prompt_logprobs: one per prompt token, the first None (nothing precedes it).
    prompt_logprobs: list[TokenLogprobs | None] | None = None


class LLM:
    def __init__(self, model: str | None = None, **settings: object) -> None:
        """`model`: what `openai-serve MODEL` takes (a checkpoint directory, a .gguf file, a Hub id, a built-in
        name); None: the default model. `settings`: the engine's, by vLLM's names (max_num_seqs, block_size,
        gpu_memory_utilization, max_model_len, dtype, enforce_eager, kv_cache_blocks, ...: core/config.py), as
        `openai-serve` takes them as flags."""
        config, _ = with_resolved_model(engine_config(model or "", **settings))
        self.engine = LLMEngine(config)
        self.tokenizer = load_tokenizer(config.model.tokenizer or config.model.model)

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[GenerationOutput]:
        """Every prompt to its end. Each is checked with the engine's limits first (RequestRejected,
        naming `prompt` or `max_tokens`); then all run together."""
        prompt_list = _as_prompt_list(prompts)
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompt_list)
        if len(params_list) != len(prompt_list):
            raise ValueError(f"{len(prompt_list)} prompts but {len(params_list)} sampling params")
        token_lists = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt_list]
        checked = [self.engine.limits.check(ids, p) for ids, p in zip(token_lists, params_list, strict=True)]
        trackers: dict[str, TextTracker] = {}
        logprobs: dict[str, list[TokenLogprobs]] = {}
        for index, (token_ids, p) in enumerate(zip(token_lists, checked, strict=True)):
            request_id = str(index)
            trackers[request_id] = TextTracker(request_id, self.tokenizer, token_ids, p, self.engine.abort_request)
            logprobs[request_id] = []
            self.engine.add_request(request_id, token_ids, p.for_engine())
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                delta = trackers[out.request_id].absorb(out)
                if delta is not None:
                    logprobs[out.request_id] += [entry.logprobs for entry in delta.logprobs]
        return [_output(tracker, ids, logprobs[tracker.request_id], p.logprobs is not None)
                for tracker, ids, p in zip(trackers.values(), token_lists, checked, strict=True)]


    def embed(self, prompts: Prompt | list[Prompt], dimensions: int | None = None) -> list[np.ndarray]:
        """An embedding model's vectors (vLLM's LLM.embed): text prompts get the model's default
        sentence-transformers prompt in front; each vector is shortened and normalized as
        core/pooling_output.py says."""
        pooling = self.engine.pooling
        if pooling is None or not pooling.embeds:
            raise ValueError("this model does not make embeddings (serve it with task='embed')")
        prefix = pooling.prompt_texts.get(pooling.default_prompt_name or "", "")
        token_lists = [self.tokenizer.encode(prefix + p) if isinstance(p, str) else list(p)
                       for p in _as_prompt_list(prompts)]
        for index, token_ids in enumerate(token_lists):
            self.engine.limits.check_pooled_prompt(token_ids, "prompt")
            self.engine.add_request(str(index), token_ids, PoolingParams())
        pooled: dict[str, np.ndarray] = {}
        while self.engine.has_unfinished_requests():
            pooled.update((out.request_id, out.pooled) for out in self.engine.step() if out.pooled is not None)
        return [embedding(pooled[str(i)], pooling, dimensions) for i in range(len(token_lists))]


def _output(tracker: TextTracker, prompt_token_ids: list[int], logprobs: list[TokenLogprobs],
            wants_logprobs: bool) -> GenerationOutput:
    return GenerationOutput(
        prompt_token_ids=prompt_token_ids, token_ids=tracker.token_ids,
        logprobs=list(logprobs) if wants_logprobs else [None] * len(tracker.token_ids),
        finish_reason=tracker.finish_reason, text=tracker.text, prompt_logprobs=tracker.prompt_logprobs,
    )


def _as_prompt_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [prompts]  # type: ignore[list-item]
    return list(prompts)  # type: ignore[arg-type]
