"""prompt_logprobs in the engine: equal to transformers' log-softmax over the prompt, across prefill chunks,
prefix-cache hits (skipped for such requests) and preemptions."""

from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from core import LLM, SamplingParams

PROMPT = list(range(10, 50))


@cache
def hf_prompt_logprobs(model_dir: Path, prompt: tuple[int, ...]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].log_softmax(-1)  # [len, vocab]


def check(model_dir: Path, prompt: list[int], entries: list, num_top: int) -> None:
    expected = hf_prompt_logprobs(model_dir, tuple(prompt))
    assert len(entries) == len(prompt) and entries[0] is None
    for t in range(1, len(prompt)):
        entry, row = entries[t], expected[t - 1]
        assert entry.logprob == pytest.approx(row[prompt[t]].item(), abs=1e-4)
        assert entry.rank == int((row > row[prompt[t]]).sum()) + 1
        assert list(entry.top_token_ids) == row.topk(num_top).indices.tolist()


def test_prompt_logprobs_over_chunked_prefill_and_prefix_hits(tiny_qwen3_dir: Path) -> None:
    llm = LLM(str(tiny_qwen3_dir), dtype="float32", max_model_len=256, block_size=8, kv_cache_blocks=64,
              max_num_seqs=4, max_num_batched_tokens=16)  # a 40-token prompt in three chunks
    params = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=3)
    first = llm.generate([PROMPT], params)[0]
    check(tiny_qwen3_dir, PROMPT, first.prompt_logprobs, 3)
    hits_before = llm.engine.stats().num_prefix_cache_hit_tokens
    again, plain = llm.generate([PROMPT, PROMPT], [params, SamplingParams(temperature=0.0, max_tokens=3)])
    assert again.prompt_logprobs == first.prompt_logprobs and again.token_ids == first.token_ids
    assert plain.prompt_logprobs is None
    assert llm.engine.stats().num_prefix_cache_hit_tokens > hits_before  # the plain request hit; the other did not


def test_prompt_logprobs_survive_preemption(tiny_qwen3_dir: Path) -> None:
    llm = LLM(str(tiny_qwen3_dir), dtype="float32", max_model_len=256, block_size=8, kv_cache_blocks=14,
              max_num_seqs=4, max_num_batched_tokens=16)
    prompts = [[7 + i] * 3 + PROMPT[: 20 + 5 * i] for i in range(3)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                                   prompt_logprobs=1))
    assert llm.engine.stats().num_preemptions > 0
    for prompt, out in zip(prompts, outputs, strict=True):
        check(tiny_qwen3_dir, prompt, out.prompt_logprobs, 1)
