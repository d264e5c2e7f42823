"""Parity on the GPU for the families beyond Llama and Qwen (tests/tiny_specs.py): Mistral with and without a
window, Phi-3, Gemma 3 (text and image-text), Gemma 4; through the Triton and flash-attn backends, windowed layers
included (the prompts run past the 16-24-token windows), CUDA graphs on and off.

float32 (Triton): our greedy tokens equal transformers', through chunked prefill, prefix hits and preemption.
bf16: where tokens differ, each side's token is in the other's top-5, and rarely (tests/gpu/test_parity_gpu.py's
rule). Graphs on and off give identical tokens.
"""

from pathlib import Path

import pytest
import torch

from core import SamplingParams
from tests.gpu.test_parity_gpu import (
    BACKENDS,
    LENGTHS,
    MAX_NEW,
    assert_bf16_divergences_rare_near_ties,
    hf_greedy_and_logits,
    make_llm,
)
from tests.parity.test_parity_cpu import model_dir_of, prompts_of_lengths
from tests.tiny_specs import FAMILY_SPECS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

FAMILIES = list(FAMILY_SPECS)
GPU_BACKENDS = [b for b in BACKENDS if b in ("triton", "flash-attn")]


@pytest.mark.parametrize("model", FAMILIES)
def test_float32_tokens_match_transformers(tiny_model_dirs: dict[str, Path], model: str) -> None:
    model_dir = model_dir_of(tiny_model_dirs, model)
    prompts = prompts_of_lengths(LENGTHS, shared_prefix=20)
    # 16 blocks: every family preempts (windowed layers keep fewer blocks, so 24 leave Mistral's and Phi-3's room)
    llm = make_llm(model_dir, "float32", "triton", eager=False, budget=32, blocks=16)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, output in zip(prompts, outputs, strict=True):
        expected, _ = hf_greedy_and_logits(model_dir, torch.float32, prompt)
        assert output.token_ids == expected
    stats = llm.engine.stats()
    assert stats.num_prefix_cache_hit_tokens > 0 and stats.num_preemptions > 0


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("model", FAMILIES)
def test_bf16_divergences_are_rare_near_ties(tiny_model_dirs: dict[str, Path], model: str, backend: str) -> None:
    model_dir = model_dir_of(tiny_model_dirs, model)
    prompts = prompts_of_lengths(LENGTHS)
    llm = make_llm(model_dir, "bfloat16", backend, eager=False)
    assert llm.engine.runner.backend.name == backend
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5))
    assert_bf16_divergences_rare_near_ties(model_dir, prompts, outputs)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("model", FAMILIES)
def test_cuda_graphs_on_and_off_give_identical_tokens(tiny_model_dirs: dict[str, Path], model: str,
                                                      backend: str) -> None:
    model_dir = model_dir_of(tiny_model_dirs, model)
    prompts = prompts_of_lengths(LENGTHS * 3)  # 24 sequences: several graph buckets, padded rows
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    eager = make_llm(model_dir, "bfloat16", backend, eager=True).generate(prompts, params)
    graphs = make_llm(model_dir, "bfloat16", backend, eager=False).generate(prompts, params)
    assert [o.token_ids for o in graphs] == [o.token_ids for o in eager]
