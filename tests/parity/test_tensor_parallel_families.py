"""Tensor parallelism for the MoE families and the Gated DeltaNet hybrids on CPU: TP=2 (two gloo worker processes,
each holding half of every expert's intermediate rows, of the attention heads and of the linear layers' key and value
heads with their states, one all-reduce after each block) gives exactly TP=1's float32 greedy tokens, which are
transformers', through chunked prefill, preemption and prefix-cache hits (for the hybrids, hits that restore state
snapshots). One TP=2 engine per model serves its cases, as in tests/parity/test_tensor_parallel_cpu.py."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core import LLM, SamplingParams
from tests.hybrid_models import build_hybrid_model, with_slow_decays
from tests.moe_models import build_moe_model
from tests.parity.test_parity_cpu import hf_greedy, prompts_of_lengths, record_schedules
from tests.parity.test_tensor_parallel_cpu import make_llm

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
BUILDERS: dict[str, Callable[..., Path]] = {
    **dict.fromkeys(("qwen3_moe", "mixtral", "glm4_moe", "gpt_oss"), build_moe_model),
    # Slow decays, so a state carried across chunks or restored at a hit wrong shows in the tokens.
    **dict.fromkeys(("qwen3_next", "qwen3_5", "qwen3_5_moe"),
                    lambda root, name, base: with_slow_decays(build_hybrid_model(root, name, base))),
}
Engines = tuple[Path, LLM, LLM]  # the checkpoint, its TP=1 engine, its TP=2 engine


@pytest.fixture(scope="module", params=list(BUILDERS))
def engines(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    model_dir = BUILDERS[request.param](tmp_path_factory.mktemp(request.param), request.param,
                                        tiny_model_dirs["qwen3"])
    sharded = make_llm(model_dir, 2)
    yield model_dir, make_llm(model_dir, 1), sharded
    sharded.engine.close()


def test_a_batch_that_is_chunked_and_preempted(engines: Engines) -> None:
    model_dir, single, sharded = engines
    prompts = prompts_of_lengths((7, 12, 3, 18, 9, 14, 40))
    records = record_schedules(sharded.engine)
    tokens = [o.token_ids for o in sharded.generate(prompts, GREEDY)]
    assert sharded.engine.stats().num_preemptions > 0
    assert sum(s.end < s.seq.num_prompt_tokens for out in records for s in out.scheduled) >= 3, "chunked prefill"
    assert tokens == [o.token_ids for o in single.generate(prompts, GREEDY)]
    assert tokens == [hf_greedy(model_dir, p, MAX_NEW_TOKENS) for p in prompts]


def test_shared_prefixes_hit_the_prefix_cache(engines: Engines) -> None:
    """Three prompts sharing 24 tokens, one after another: the second and third hit what the first cached."""
    model_dir, single, sharded = engines
    prompts = prompts_of_lengths((3, 6, 1), shared_prefix=24)
    before = sharded.engine.stats().num_prefix_cache_hit_tokens
    tokens = [o.token_ids for p in prompts for o in sharded.generate([p], GREEDY)]
    assert sharded.engine.stats().num_prefix_cache_hit_tokens - before >= 2 * 24
    assert tokens == [o.token_ids for o in single.generate(prompts, GREEDY)]
    assert tokens == [hf_greedy(model_dir, p, MAX_NEW_TOKENS) for p in prompts]
