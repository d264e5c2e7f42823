"""quack's gated GEMM (gpu/kernels/gated_gemm.py): SiLU-and-mul in the gate/up product's epilogue, against the unfused
pair (cuBLAS, then our SiLU kernel) and, through a model, against transformers; which products take it; CUDA graphs.

It rounds once where the pair rounds four times: outputs agree within bf16/fp16 error, greedy tokens rarely differ
and only at near-ties (the bf16 parity rule of tests/gpu/test_parity_gpu.py).
"""

import importlib.util
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.config import engine_config
from core.engine import runner_config
from gpu.config import KernelConfig
from gpu.kernels import gated_gemm
from gpu.layers.linear import MergedLinear
from gpu.model_runner import ModelRunner
from tests.gpu.test_parity_gpu import assert_bf16_divergences_rare_near_ties
from tests.parity.test_parity_cpu import prompts_of_lengths

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("quack") is None
    or torch.cuda.get_device_capability()[0] != 9, reason="needs quack on a Hopper GPU")

DEVICE = torch.device("cuda")
MAX_NEW = 12


@pytest.fixture(scope="module", autouse=True)
def probed() -> None:
    for dtype in gated_gemm.DTYPES:
        assert gated_gemm.unavailable_reason(DEVICE, dtype) is None


@pytest.mark.parametrize("dtype", gated_gemm.DTYPES)
@pytest.mark.parametrize(("rows", "hidden", "intermediate"), [
    (1024, 1024, 3072), (3001, 1024, 3072), (8192, 1024, 3072), (2048, 64, 128), (1500, 4096, 1536)])
def test_the_epilogue_equals_the_unfused_pair_within_rounding(dtype: torch.dtype, rows: int, hidden: int,
                                                               intermediate: int) -> None:
    from gpu.kernels.silu_and_mul import silu_and_mul

    torch.manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, device=DEVICE, dtype=dtype)
    weight = (torch.randn(2 * intermediate, hidden, device=DEVICE) / hidden**0.5).to(dtype)
    fused = gated_gemm.silu_and_mul_product(x, weight)
    pair = silu_and_mul(x @ weight.t())
    exact = torch.nn.functional.silu(x.float() @ weight[:intermediate].float().t()) * (
        x.float() @ weight[intermediate:].float().t())
    assert fused.shape == (rows, intermediate) and fused.dtype == dtype
    # The fused one within 4 units in the last place of the exact product, on average no further from it than the pair.
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    fused_error, pair_error = (fused.float() - exact).abs(), (pair.float() - exact).abs()
    assert float((fused_error / (exact.abs() + 1e-2)).max()) <= 4 * ulp
    assert float(fused_error.mean()) <= float(pair_error.mean())


def gate_up_layer(hidden: int, intermediate: int, kernels: KernelConfig, bias: bool = False) -> MergedLinear:
    layer = MergedLinear(hidden, {"gate": intermediate, "up": intermediate}, bias, kernels)
    return layer.to(DEVICE, torch.bfloat16).requires_grad_(False)


def test_only_products_of_many_rows_without_bias_take_it() -> None:
    layer = gate_up_layer(256, 512, KernelConfig())
    rows = gated_gemm.MIN_ROWS
    assert layer.fuses_silu_and_mul(torch.zeros(rows, 256, device=DEVICE, dtype=torch.bfloat16))
    assert not layer.fuses_silu_and_mul(torch.zeros(rows - 1, 256, device=DEVICE, dtype=torch.bfloat16))
    assert not layer.fuses_silu_and_mul(torch.zeros(rows, 256, device=DEVICE, dtype=torch.float32))
    assert not gate_up_layer(256, 512, KernelConfig(fused_kernels=False)).fuses_silu_and_mul(
        torch.zeros(rows, 256, device=DEVICE, dtype=torch.bfloat16))
    assert not gate_up_layer(256, 512, KernelConfig(), bias=True).fuses_silu_and_mul(
        torch.zeros(rows, 256, device=DEVICE, dtype=torch.bfloat16))


# Prompts long enough that the steps carrying them have MIN_ROWS+ tokens: the gated epilogue's rows.
LONG_LENGTHS = (700, 900, 1200, 40, 1500, 3, 2000, 650)


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_bf16_tokens_against_transformers_diverge_rarely_near_ties(tiny_model_dirs: dict[str, Path],
                                                                    model: str) -> None:
    prompts = prompts_of_lengths(LONG_LENGTHS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5)
    outputs = llm(tiny_model_dirs[model]).generate(prompts, params)
    assert_bf16_divergences_rare_near_ties(tiny_model_dirs[model], prompts, outputs)


def test_the_epilogue_runs_in_the_prefill_graphs_as_eagerly(tiny_model_dirs: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = prompts_of_lengths(LONG_LENGTHS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    runs = {}
    for eager in (False, True):
        built = llm(tiny_model_dirs["qwen3"], eager)
        if not eager:
            mixed = built.engine.runner.mixed
            assert mixed is not None and max(mixed.buckets) >= gated_gemm.MIN_ROWS
        calls: list[int] = []

        def counted(*args: torch.Tensor, calls: list[int] = calls,
                    product: Callable[..., torch.Tensor] = gated_gemm.silu_and_mul_product) -> torch.Tensor:
            calls.append(1)
            return product(*args)

        monkeypatch.setattr(gated_gemm, "silu_and_mul_product", counted)
        runs[eager] = [o.token_ids for o in built.generate(prompts, params)]
        monkeypatch.undo()
        # Eagerly each step of 1024+ tokens calls it once per layer; a graph replay calls no Python.
        assert (len(calls) > 0) == eager
    assert runs[False] == runs[True]


def test_the_reference_runner_builds_the_unfused_pair(tiny_model_dirs: dict[str, Path]) -> None:
    config = replace(runner_config(engine_config(
        str(tiny_model_dirs["qwen3"]), dtype="bfloat16", device="cuda", block_size=16, kv_cache_blocks=256,
        max_num_seqs=4, max_num_batched_tokens=2048, attention_backend="triton", enforce_eager=True,
    )), kernels=KernelConfig(fused_kernels=False))
    runner = ModelRunner(config)
    gate_up = runner.model.model.layers[0].mlp.gate_up_proj
    assert not gate_up.fuses_silu_and_mul(torch.zeros(gated_gemm.MIN_ROWS, gate_up.in_features, device=DEVICE,
                                                      dtype=torch.bfloat16))


def test_a_start_remembers_the_verdict_and_a_later_one_takes_a_failure_unprobed(
        tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu.model_runner")
    llm(tiny_model_dirs["qwen3"], eager=True, cache_dir=tmp_path)
    (path,) = (tmp_path / "probes").iterdir()
    data = json.loads(path.read_text())
    assert data["reason"] is None and data["key"]["probe"] == "gated-gemm"
    path.write_text(json.dumps(data | {"reason": "a failure"}))  # as a start that failed would have left it
    monkeypatch.setattr(gated_gemm, "_probed", {})
    monkeypatch.setattr(gated_gemm, "_probe", lambda device, dtype: pytest.fail("probed again"))
    caplog.clear()
    LLM(str(tiny_model_dirs["qwen3"]), dtype="bfloat16", device="cuda", attention_backend="triton",
        enforce_eager=True, block_size=16, kv_cache_blocks=1024, max_num_seqs=16, download_dir=str(tmp_path))
    assert f"gated GEMM off: a failure (remembered in {path}, probed on" in caplog.text
    assert not gated_gemm.is_ready(DEVICE, torch.bfloat16)


def llm(model_dir: Path, eager: bool = False, cache_dir: Path | None = None) -> LLM:
    built = LLM(str(model_dir), dtype="bfloat16", device="cuda", attention_backend="triton", enforce_eager=eager,
                block_size=16, kv_cache_blocks=1024, max_num_seqs=16, max_num_batched_tokens=4096,
                **({"download_dir": str(cache_dir)} if cache_dir is not None else {}))
    assert gated_gemm.is_ready(DEVICE, torch.bfloat16), "the runner found the gated GEMM working"
    gate_up = built.engine.runner.model.model.layers[0].mlp.gate_up_proj
    assert gate_up.fuses_silu_and_mul(torch.zeros(gated_gemm.MIN_ROWS, gate_up.in_features, device=DEVICE,
                                                  dtype=torch.bfloat16))
    return built
