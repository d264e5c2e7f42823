"""The oracle for the MoE families: with the same weights, our greedy tokens equal transformers' (float32, CPU),
through plain batches, prefix-cache hits, preemption and chunked prefill, each case checking it took its path
(as tests/parity/test_parity_cpu.py does for the dense families). Checkpoints: tests/moe_models.py."""

from pathlib import Path

import pytest

from core import SamplingParams
from tests.moe_models import MOE_CONFIGS, build_moe_model
from tests.parity.test_parity_cpu import (
    GREEDY,
    PROMPT_LENGTHS,
    assert_matches_hf,
    hf_greedy,
    make_llm,
    prompts_of_lengths,
    record_schedules,
)

MODELS = tuple(MOE_CONFIGS)


@pytest.fixture(scope="module")
def moe_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-models")
    return {name: build_moe_model(root / name, name, tiny_model_dirs["qwen3"]) for name in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_batch_of_different_lengths(moe_dirs: dict[str, Path], model: str) -> None:
    prompts = prompts_of_lengths(PROMPT_LENGTHS)
    assert_matches_hf(moe_dirs[model], prompts, make_llm(moe_dirs[model]).generate(prompts, GREEDY))


@pytest.mark.parametrize("model", MODELS)
def test_shared_prefixes_hit_the_prefix_cache(moe_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(moe_dirs[model])
    prompts = prompts_of_lengths((3, 11, 20, 1), shared_prefix=48)
    first = llm.generate(prompts[:1], GREEDY)
    rest = llm.generate(prompts[1:], GREEDY)
    assert llm.engine.stats().num_prefix_cache_hit_tokens >= 3 * 48
    assert_matches_hf(moe_dirs[model], prompts, first + rest)


@pytest.mark.parametrize("model", MODELS)
def test_small_kv_cache_preempts_and_recomputes(moe_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(moe_dirs[model], num_blocks=12, block_size=4)
    prompts = prompts_of_lengths((7, 12, 3, 18, 9, 14))
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.stats().num_preemptions > 0
    assert_matches_hf(moe_dirs[model], prompts, outputs)
    assert llm.engine.stats().num_used_blocks == 0


@pytest.mark.parametrize("model", MODELS)
def test_small_token_budget_chunks_prompts(moe_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(moe_dirs[model], max_tokens_per_step=16)
    records = record_schedules(llm.engine)
    prompts = prompts_of_lengths((50, 7, 40, 23))
    outputs = llm.generate(prompts, GREEDY)
    assert sum(s.end < s.seq.num_prompt_tokens for out in records for s in out.scheduled) >= 4, "chunked prefill"
    assert_matches_hf(moe_dirs[model], prompts, outputs)


def test_long_generations_match_including_eos(moe_dirs: dict[str, Path]) -> None:
    # Many tokens on a random model: every router decision along the way must agree with transformers'.
    prompts = prompts_of_lengths(tuple(range(1, 9)))
    params = SamplingParams(temperature=0.0, max_tokens=40)
    for model in MODELS:
        for prompt, output in zip(prompts, make_llm(moe_dirs[model]).generate(prompts, params), strict=True):
            assert output.token_ids == hf_greedy(moe_dirs[model], prompt, max_new_tokens=40), model
