"""The oracle for the MoE families: with the same weights, our greedy tokens equal transformers' (float32, CPU).
Each family runs the dense families' cases of tests/parity/test_parity_cpu.py (plain batches, prefix-cache hits,
preemption, chunked prefill, requests joining a running batch: each checking it took its path) on tiny random
checkpoints of tests/moe_models.py, long generations, where every router decision must agree, and for a windowed
family (gpt-oss) a prefix hit after its windowed layers freed the blocks before their window."""

from collections.abc import Callable
from pathlib import Path

import pytest

from core import SamplingParams
from tests.moe_models import MOE_CONFIGS, build_moe_model
from tests.parity import test_parity_cpu as dense

MODELS = tuple(MOE_CONFIGS)
WINDOWED = [name for name, (_, values) in MOE_CONFIGS.items() if values.get("sliding_window")]
CASES: dict[str, Callable[[dict[str, Path], str], None]] = {
    "batch": dense.test_batch_of_different_lengths,
    "prefix-cache": dense.test_shared_prefixes_hit_the_prefix_cache,
    "preemption": dense.test_small_kv_cache_preempts_and_recomputes,
    "chunked-prefill": dense.test_small_token_budget_chunks_prompts,
    "joining": dense.test_requests_added_while_others_run,
}


@pytest.fixture(scope="module")
def moe_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-models")
    return {name: build_moe_model(root / name, name, tiny_model_dirs["qwen3"]) for name in MODELS}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", MODELS)
def test_every_path_matches_transformers(moe_dirs: dict[str, Path], model: str, case: str) -> None:
    CASES[case](moe_dirs, model)


@pytest.mark.parametrize("model", WINDOWED)
def test_a_shared_prefix_hits_after_its_windowed_blocks_were_freed(moe_dirs: dict[str, Path], model: str) -> None:
    dense.test_a_shared_prefix_hits_after_its_windowed_blocks_were_freed(moe_dirs, model)


@pytest.mark.parametrize("model", MODELS)
def test_long_generations_match(moe_dirs: dict[str, Path], model: str) -> None:
    prompts = dense.prompts_of_lengths(tuple(range(1, 9)))
    params = SamplingParams(temperature=0.0, max_tokens=40)
    for prompt, output in zip(prompts, dense.make_llm(moe_dirs[model]).generate(prompts, params), strict=True):
        assert output.token_ids == dense.hf_greedy(moe_dirs[model], prompt, max_new_tokens=40)


def test_glm_skips_its_multi_token_prediction_layers(moe_dirs: dict[str, Path], tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """GLM checkpoints carry `num_nextn_predict_layers` layers after the decoder's, which the model does not run."""
    import shutil

    import torch
    from safetensors.torch import save_file

    directory = tmp_path / "glm-with-mtp"
    shutil.copytree(moe_dirs["glm4_moe"], directory)
    num_layers = MOE_CONFIGS["glm4_moe"][1]["num_hidden_layers"]
    save_file({f"model.layers.{num_layers}.eh_proj.weight": torch.zeros(64, 128),
               f"model.layers.{num_layers}.mlp.experts.0.gate_proj.weight": torch.zeros(32, 64)},
              str(directory / "mtp.safetensors"))
    prompts = dense.prompts_of_lengths((5, 17))
    with caplog.at_level("INFO", logger="gpu.loader"):
        outputs = dense.make_llm(directory).generate(prompts, dense.GREEDY)
    assert "left out 2 checkpoint tensors" in caplog.text
    dense.assert_matches_hf(moe_dirs["glm4_moe"], prompts, outputs)
