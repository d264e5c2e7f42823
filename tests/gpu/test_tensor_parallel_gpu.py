"""Tensor parallelism on two GPUs (NCCL, collectives captured in the decode CUDA graphs).

float32: TP=2's greedy tokens equal transformers' through chunked prefill, prefix hits and preemption.
bf16: TP=2 against TP=1 by the project's rule (where tokens differ, each side's is in the other's top-5,
and it happens rarely), also through steps of 512+ prompt tokens where each rank takes quack's gated GEMM (where
it is installed). TP=2 with CUDA graphs on and off gives identical tokens. Models as in
tests/parity/test_tensor_parallel_cpu.py: Qwen3 (2 KV heads), Llama with 1 KV head (replicated), Llama
with 2 KV heads, biases and an odd vocabulary.
"""

import importlib.util
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from tests.gpu.test_parity_gpu import hf_greedy_and_logits
from tests.greedy_agreement import assert_diverge_rarely_near_ties
from tests.parity.test_parity_cpu import prompts_of_lengths
from tests.parity.test_tensor_parallel_cpu import MODELS, model_dirs  # noqa: F401 - a fixture, used here too

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

MAX_NEW = 16
LENGTHS = (1, 7, 16, 17, 40, 100, 3, 64)


@pytest.fixture(scope="module")
def llm() -> Iterator[Callable[..., LLM]]:
    """Engines by (model dir, dtype, tensor-parallel size, eager, budget, blocks), each started once."""
    started: dict[tuple[object, ...], LLM] = {}

    def get(model_dir: Path, dtype: str, tp: int, eager: bool = False, budget: int = 512, blocks: int = 512) -> LLM:
        key = (model_dir, dtype, tp, eager, budget, blocks)
        if key not in started:
            started[key] = LLM(str(model_dir), dtype=dtype, device="cuda", tensor_parallel_size=tp,
                               enforce_eager=eager, block_size=16, kv_cache_blocks=blocks, max_num_seqs=16,
                               max_num_batched_tokens=budget)
        return started[key]

    yield get
    for engine in started.values():
        engine.engine.close()


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_float32_tokens_match_transformers(model_dirs: dict[str, Path], llm: Callable[..., LLM],  # noqa: F811
                                           model: str) -> None:
    prompts = prompts_of_lengths(LENGTHS, shared_prefix=20)
    # Small token budget and cache: chunked prefill, prefix hits and preemption, with NCCL and graphs.
    engine = llm(model_dirs[model], "float32", 2, budget=32, blocks=24)
    assert engine.engine.runner.has_cuda_graphs
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, output in zip(prompts, outputs, strict=True):
        expected, _ = hf_greedy_and_logits(model_dirs[model], torch.float32, prompt)
        assert output.token_ids == expected
    stats = engine.engine.stats()
    assert stats.num_prefix_cache_hit_tokens > 0 and stats.num_preemptions > 0


@pytest.mark.parametrize("model", MODELS)
def test_bf16_two_ranks_diverge_from_one_rarely_and_near_ties(model_dirs: dict[str, Path],  # noqa: F811
                                                              llm: Callable[..., LLM], model: str) -> None:
    prompts = prompts_of_lengths(LENGTHS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5)
    single = llm(model_dirs[model], "bfloat16", 1).generate(prompts, params)
    sharded = llm(model_dirs[model], "bfloat16", 2).generate(prompts, params)
    assert_diverge_rarely_near_ties(sharded, single)


@pytest.mark.skipif(torch.cuda.device_count() < 2 or importlib.util.find_spec("quack") is None
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs quack on Hopper GPUs")
def test_bf16_prompt_steps_take_the_gated_gemm_on_each_rank(model_dirs: dict[str, Path],  # noqa: F811
                                                           llm: Callable[..., LLM], caplog: pytest.LogCaptureFixture,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """Steps of 512+ prompt tokens, where each rank computes its share of gate/up with SiLU-and-mul in the
    product's epilogue (gpu/kernels/gated_gemm.py: each rank's runner says so in its log), against one rank that
    does too: the bf16 rule."""
    caplog.set_level(logging.INFO)  # the workers log at the engine's level
    prompts = prompts_of_lengths((700, 900, 40, 650))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5)
    single = llm(model_dirs["qwen3"], "bfloat16", 1, budget=2048).generate(prompts, params)
    sharded = llm(model_dirs["qwen3"], "bfloat16", 2, budget=2048).generate(prompts, params)
    workers_log = capfd.readouterr().err
    assert "SiLU-and-mul in their epilogue" in caplog.text  # the single rank, in this process
    for rank in (0, 1):
        assert f"[rank {rank}]: gate/up products of 512+ rows compute SiLU-and-mul" in workers_log
    assert_diverge_rarely_near_ties(sharded, single)


def test_cuda_graphs_on_and_off_give_identical_tokens(model_dirs: dict[str, Path],  # noqa: F811
                                                      llm: Callable[..., LLM]) -> None:
    prompts = prompts_of_lengths(LENGTHS * 3)  # 24 sequences: several graph buckets, padded rows
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    # Engines of their own (a cache size no other test asks for): an engine that served earlier tests' prompts hits
    # their cached prefixes, and prompt steps cut there round differently in bf16 from the other engine's.
    graphs = llm(model_dirs["qwen3"], "bfloat16", 2, blocks=384)
    eager = llm(model_dirs["qwen3"], "bfloat16", 2, eager=True, blocks=384)
    assert graphs.engine.runner.has_cuda_graphs and not eager.engine.runner.has_cuda_graphs
    assert [o.token_ids for o in graphs.generate(prompts, params)] == \
        [o.token_ids for o in eager.generate(prompts, params)]


def test_a_stopped_engine_s_workers_exit_by_themselves(model_dirs: dict[str, Path],  # noqa: F811
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The workers of a TP=2 engine that replayed CUDA graphs with NCCL inside end when told, well within
    the engine's wait (a worker that does not is killed, logged as 'did not stop')."""
    engine = LLM(str(model_dirs["qwen3"]), dtype="bfloat16", device="cuda", tensor_parallel_size=2, block_size=16,
                 kv_cache_blocks=64, max_num_seqs=4)
    engine.generate(prompts_of_lengths((5, 9)), SamplingParams(temperature=0.0, max_tokens=4))
    workers = engine.engine.runner._workers  # noqa: SLF001 - their exit codes are what this test checks
    started = time.monotonic()
    engine.engine.close()
    assert time.monotonic() - started < 5.0
    assert "did not stop" not in caplog.text
    assert [worker.process.returncode for worker in workers] == [0, 0]
