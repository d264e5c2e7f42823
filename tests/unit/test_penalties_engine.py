"""Penalties and logit bias through the engine on the tiny model: greedy tokens equal transformers'
generate() with the same processors; counts survive async scheduling and preemption; seeded rows
draw the same alone and batched; requests without them never touch the penalty path."""

from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from core import LLM, SamplingParams
from core.engine import LLMEngine
from gpu.sampler import Sampler

MAX_TOKENS = 16


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence/frequency penalties over the generated tokens (transformers has no such processor)."""

    def __init__(self, num_prompt_tokens: int, presence: float, frequency: float) -> None:
        self.num_prompt_tokens, self.presence, self.frequency = num_prompt_tokens, presence, frequency

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.num_prompt_tokens :]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


@cache
def hf_model(model_dir: Path, device: str = "cpu") -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()


def hf_greedy(model_dir: Path, prompt: list[int], params: SamplingParams, device: str = "cpu") -> list[int]:
    """transformers' greedy tokens with the request's penalties and logit bias (tests/gpu runs it on CUDA)."""
    kwargs: dict[str, object] = {"repetition_penalty": params.repetition_penalty}
    if params.logit_bias:
        kwargs["sequence_bias"] = [[[token_id], value] for token_id, value in params.logit_bias]
    if params.presence_penalty or params.frequency_penalty:
        kwargs["logits_processor"] = LogitsProcessorList(
            [OpenAIPenalties(len(prompt), params.presence_penalty, params.frequency_penalty)])
    with torch.no_grad():
        out = hf_model(model_dir, device).generate(torch.tensor([prompt], device=device), max_new_tokens=MAX_TOKENS,
                                                   do_sample=False, **kwargs)
    return out[0, len(prompt) :].tolist()


def make_llm(model_dir: Path, num_blocks: int = 128, async_scheduling: bool = True) -> LLM:
    return LLM(str(model_dir), dtype="float32", max_model_len=256, block_size=8, kv_cache_blocks=num_blocks,
               max_num_seqs=8, max_num_batched_tokens=64, async_scheduling=async_scheduling)


PROMPTS = [[5, 9, 14, 30, 30, 7], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110], [42] * 9]
CASES = [
    SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.8),
    SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, presence_penalty=1.5, frequency_penalty=1.0),
    SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=0.6, frequency_penalty=-0.5),
    SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logit_bias={60: 2.0, 61: -100.0}, repetition_penalty=1.3),
]


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: Path) -> LLM:
    return make_llm(tiny_qwen3_dir)


def test_greedy_tokens_equal_transformers_generate_with_the_same_processors(llm: LLM, tiny_qwen3_dir: Path) -> None:
    prompts = [p for p in PROMPTS for _ in CASES]
    params = CASES * len(PROMPTS)
    ours = [o.token_ids for o in llm.generate(prompts, params)]  # all in one batch, each in its own slot
    plain = [o.token_ids for o in llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)]
                                               * len(prompts))]
    expected = [hf_greedy(tiny_qwen3_dir, p, c) for p, c in zip(prompts, params, strict=True)]
    assert ours == expected
    assert sum(a != b for a, b in zip(ours, plain, strict=True)) >= len(prompts) - 2  # the penalties bite


PENALIZED = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, repetition_penalty=1.5,
                             frequency_penalty=0.4),
    "seeded": SamplingParams(temperature=0.9, seed=5, max_tokens=24, ignore_eos=True, presence_penalty=1.2,
                             repetition_penalty=1.1, logit_bias={3: 1.5}),
    "plain": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
}


def run_workload(engine: LLMEngine) -> dict[str, list[int]]:
    for i in range(3):
        for name, params in PENALIZED.items():
            engine.add_request(f"{name}{i}", [10 + i] * (5 + 11 * i), params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert engine.stats().num_used_blocks == 0 and engine.penalty_slots.num_free == 8
    return tokens


def test_counts_survive_in_flight_tokens_and_preemption(tiny_qwen3_dir: Path) -> None:
    """Async scheduling with preemptions against sync scheduling with room for all: the same tokens."""
    reference = run_workload(make_llm(tiny_qwen3_dir, async_scheduling=False).engine)
    engine = make_llm(tiny_qwen3_dir, num_blocks=12).engine
    assert run_workload(engine) == reference
    assert engine.scheduler.num_preemptions > 0  # recomputed sequences took slots anew, filled from their tokens


def test_seeded_penalized_request_draws_the_same_alone_and_in_a_batch(llm: LLM) -> None:
    seeded = PENALIZED["seeded"]
    alone = llm.generate([[7, 8, 9]], seeded)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=30, frequency_penalty=0.5)] * 3
    batch = llm.generate([[20] * 5, [7, 8, 9], [21] * 12, [22] * 3], [others[0], seeded, *others[1:]])
    assert batch[1].token_ids == alone
    unpenalized = SamplingParams(temperature=0.9, seed=5, max_tokens=40, ignore_eos=True)
    assert llm.generate([[7, 8, 9]], unpenalized)[0].token_ids != alone


def test_logit_bias_of_100_forces_a_token_and_minus_100_bans_one(llm: LLM) -> None:
    forced = llm.generate([[30, 31]], SamplingParams(temperature=1.0, max_tokens=12, logit_bias={77: 100}))[0]
    assert forced.token_ids == [77] * 12
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    top = llm.generate([[30, 31]], greedy)[0].token_ids
    banned = set(top)
    biased = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logit_bias=dict.fromkeys(banned, -100))
    assert not banned & set(llm.generate([[30, 31]], biased)[0].token_ids)


def test_requests_without_penalties_never_take_the_adjusting_path(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    adjusted_logits = Sampler._adjusted_logits

    def spy(self: Sampler, *args: object) -> torch.Tensor:
        calls.append(1)
        return adjusted_logits(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Sampler, "_adjusted_logits", spy)
    llm.generate([[1, 2, 3]] * 4, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=8, logprobs=2))
    assert calls == []
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0.7, max_tokens=8, presence_penalty=0.1))
    assert calls  # the spy sees the path when it is taken
