"""The residual add in the o/down products' epilogue (gpu/layers/linear.py's `forward_adding`: cuBLAS's addmm): which
products take it, what it computes, and that a model's bf16 tokens with it still match transformers'."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.config import engine_config
from core.engine import runner_config
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE
from gpu.layers.parallel_linear import RowParallelLinear
from gpu.model_runner import ModelRunner
from tests.gpu.test_parity_gpu import assert_bf16_divergences_rare_near_ties
from tests.parity.test_parity_cpu import prompts_of_lengths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DEVICE = torch.device("cuda")


def down_layer(kernels: KernelConfig = DEFAULT_KERNELS, bias: bool = False,
               dtype: torch.dtype = torch.bfloat16) -> RowParallelLinear:
    layer = RowParallelLinear(512, 256, bias, SINGLE, kernels).to(DEVICE, dtype).requires_grad_(False)
    torch.nn.init.normal_(layer.weight, std=512**-0.5)
    return layer


def test_only_products_past_the_skinny_rows_in_half_precision_take_it() -> None:
    layer = down_layer()
    x, residual = torch.zeros(257, 512, device=DEVICE, dtype=torch.bfloat16), torch.zeros(257, 256, device=DEVICE,
                                                                                            dtype=torch.bfloat16)
    assert layer.adds_residual(x, residual)
    assert not layer.adds_residual(x[:256], residual[:256])  # the skinny GEMM's rows
    assert not layer.adds_residual(x, None)
    assert not down_layer(KernelConfig(residual_epilogue=False)).adds_residual(x, residual)
    assert not down_layer(bias=True).adds_residual(x, residual)
    assert not down_layer(dtype=torch.float32).adds_residual(x.float(), residual.float())


@pytest.mark.parametrize("rows", [257, 1000, 8192])
def test_it_computes_the_product_plus_the_residual(rows: int) -> None:
    torch.manual_seed(rows)
    layer = down_layer()
    x = torch.randn(rows, 512, device=DEVICE, dtype=torch.bfloat16)
    residual = torch.randn(rows, 256, device=DEVICE, dtype=torch.bfloat16)
    exact = x.float() @ layer.weight.float().t() + residual.float()
    fused = layer.forward_adding(x, residual)
    assert fused.dtype == torch.bfloat16
    # One rounding of the float32 sum, where product-then-add rounds twice: within a bf16 unit of the exact sum.
    torch.testing.assert_close(fused.float(), exact, rtol=2**-7, atol=2**-7)
    unfused = (layer(x) + residual).float()
    assert float((fused.float() - exact).abs().mean()) <= float((unfused - exact).abs().mean())


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_bf16_tokens_against_transformers_diverge_rarely_near_ties(tiny_model_dirs: dict[str, Path],
                                                                    model: str) -> None:
    prompts = prompts_of_lengths((700, 900, 40, 1500, 3, 300))  # steps of 257+ rows: the epilogue's
    llm = LLM(str(tiny_model_dirs[model]), dtype="bfloat16", device="cuda", attention_backend="triton",
              block_size=16, kv_cache_blocks=512, max_num_seqs=16, max_num_batched_tokens=2048)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, logprobs=5))
    assert_bf16_divergences_rare_near_ties(tiny_model_dirs[model], prompts, outputs)


def test_switched_off_the_layers_add_the_residual_in_the_norm(tiny_model_dirs: dict[str, Path]) -> None:
    config = replace(runner_config(engine_config(
        str(tiny_model_dirs["qwen3"]), dtype="bfloat16", device="cuda", block_size=16, kv_cache_blocks=256,
        max_num_seqs=4, max_num_batched_tokens=2048, attention_backend="triton", enforce_eager=True,
    )), kernels=KernelConfig(residual_epilogue=False))
    layer = ModelRunner(config).model.model.layers[0]
    x = torch.zeros(1024, layer.mlp.down_proj.in_features, device=DEVICE, dtype=torch.bfloat16)
    residual = torch.zeros(1024, layer.mlp.down_proj.out_features, device=DEVICE, dtype=torch.bfloat16)
    assert not layer.mlp.down_proj.adds_residual(x, residual)
