"""`--load-format dummy` (gpu/dummy_weights.py): a model from its config.json alone, with weights drawn on the
device by the stated rule; the same flag for the server, the offline LLM and the benchmarks."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from openai_serve.cli import parse_settings
from tests.moe_models import build_moe_model


@pytest.fixture(scope="module")
def config_only(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3-MoE checkpoint directory with its weights removed: config.json and the tokenizer only."""
    directory = build_moe_model(tmp_path_factory.mktemp("moe"), "qwen3_moe", tiny_model_dirs["qwen3"])
    for weights in directory.glob("*.safetensors"):
        weights.unlink()
    return directory


def test_a_model_runs_from_its_config_alone(config_only: Path) -> None:
    llm = LLM(str(config_only), device="cpu", dtype="float32", load_format="dummy", kv_cache_blocks=32)
    outputs = llm.generate([[5, 6, 7], [9] * 20], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert [len(o.token_ids) for o in outputs] == [6, 6]
    std = json.loads((config_only / "config.json").read_text())["initializer_range"]
    for name, param in llm.engine.runner.model.named_parameters():
        assert torch.isfinite(param).all(), name
        if getattr(param, "is_optional", False):  # an FP8 cache's scales: 1, as without them in a checkpoint
            assert (param == 1.0).all(), name
        elif param.dim() == 1:
            assert (param == (1.0 if "norm" in name else 0.0)).all(), name
        else:
            assert abs(param.std().item() - std) < 0.1 * std and abs(param.mean().item()) < 0.1 * std, name


def test_without_dummy_the_missing_weights_are_an_error(config_only: Path) -> None:
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(config_only), device="cpu", dtype="float32", kv_cache_blocks=32)


def test_routers_spread_tokens_over_the_experts(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """At the default spread (0.02), routers' logits are small: a batch's tokens reach nearly every expert, as a
    benchmark's ideal assumes of uniform routing."""
    directory = build_moe_model(tmp_path / "moe", "qwen3_moe", tiny_model_dirs["qwen3"])
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"initializer_range": 0.02}))
    llm = LLM(str(directory), device="cpu", dtype="float32", load_format="dummy", kv_cache_blocks=32)
    router = llm.engine.runner.model.model.layers[0].mlp.gate
    num_experts = llm.engine.runner.model.config.num_experts
    routed = router(torch.randn(64, config["hidden_size"]))  # normed hidden states
    assert torch.unique(routed.expert_ids).numel() == num_experts
    counts = torch.bincount(routed.expert_ids.flatten(), minlength=num_experts)
    assert counts.max() <= 3 * counts.float().mean()


def test_the_flag_and_its_values(config_only: Path, tmp_path: Path) -> None:
    assert parse_settings([]).engine.model.load_format == "auto"
    assert parse_settings(["--load-format", "dummy"]).engine.model.load_format == "dummy"
    with pytest.raises(SystemExit):
        parse_settings(["--load-format", "pt"])
    shutil.copytree(config_only, tmp_path / "copy")
    assert torch.get_default_dtype() == torch.float32  # building the model in its dtype restores the default


def test_tensor_parallel_ranks_draw_their_shards(config_only: Path) -> None:
    """Each rank draws its own shards from the same seed, so replicated weights (routers, norms) agree."""
    llm = LLM(str(config_only), device="cpu", dtype="float32", load_format="dummy", kv_cache_blocks=32,
              tensor_parallel_size=2)
    try:
        outputs = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
        assert len(outputs[0].token_ids) == 5
    finally:
        llm.engine.close()
