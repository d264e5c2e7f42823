"""FP8 block-scaled experts on CUDA (gpu/kernels/fused_moe.py reading gpu/quant/fp8_experts.py's stored form): the
kernel against the torch reference on the exact dequantization over row counts at Qwen3-30B-A3B-FP8's shape (128x128
blocks) and an odd one, in bf16 (tests/gpu/test_fused_moe.py's tolerance: no weight is rounded, only the activations)
and float32 (exact products); tiny Qwen3-MoEs with FP8 experts and layers served with their experts kept in FP8, by
the top-5 rule against transformers on the dequantized checkpoints (bf16 held to the bf16 reference's record against
its float32 one)."""

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import torch

from core import LLM, GenerationOutput, SamplingParams
from tests import quant_checkpoints as qc
from tests.gpu.test_fused_moe import assert_close
from tests.gpu.test_parity_gpu import (
    LENGTHS,
    MAX_NEW,
    References,
    assert_bf16_departs_no_more_than_transformers_over_checkpoints,
)
from tests.gpu.test_quantized_gpu import w8a8_reference
from tests.moe_cases import quantized_kernel_and_reference, random_fp8_experts, random_routing
from tests.parity.test_parity_cpu import prompts_of_lengths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels need CUDA")
pytest.importorskip("gpu.kernels.fused_moe")

ROW_COUNTS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 64, 100, 256, 512, 2048)
# (experts, top_k, hidden, intermediate, block)
SHAPES = {"qwen3-30b-a3b-fp8": (128, 8, 2048, 768, (128, 128)), "odd": (12, 3, 200, 96, (32, 32))}
BLOCK = (32, 32)  # the tiny model's


@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_experts_match_the_reference_over_row_counts(shape: str) -> None:
    num_experts, top_k, hidden, intermediate, block = SHAPES[shape]
    experts = random_fp8_experts(num_experts, hidden, intermediate, block, device="cuda")
    for num_tokens in ROW_COUNTS:
        x = torch.randn(num_tokens, hidden, device="cuda", generator=torch.Generator("cuda").manual_seed(num_tokens))
        routed = random_routing(num_tokens, num_experts, top_k, "cuda", seed=num_tokens, skewed=num_tokens % 2 == 1)
        out, reference = quantized_kernel_and_reference(experts, x.bfloat16(), routed)
        assert_close(out, reference, torch.bfloat16)


@pytest.mark.parametrize("num_tokens", [1, 7, 64, 300, 2048])
def test_float32_products_are_exact(num_tokens: int) -> None:
    experts = random_fp8_experts(16, 256, 128, (128, 128), "silu", device="cuda")
    x = torch.randn(num_tokens, 256, device="cuda")
    out, reference = quantized_kernel_and_reference(experts, x, random_routing(num_tokens, 16, 4, "cuda"))
    assert_close(out, reference, torch.float32)


def fp8_qwen3_moe(root: Path, tokenizer_dir: Path, seed: int) -> tuple[Path, Path]:
    """(a tiny Qwen3-MoE with FP8 layers and experts in 32x32 blocks, its dequantized twin): the narrowest blocks the
    dense layers' kernel takes (the FP8 MMA's K is 32), still several to each expert's projection."""
    from tests.moe_models import build_moe_model

    source = build_moe_model(root / "float", "qwen3_moe", tokenizer_dir, seed=seed)
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
    return qc.write_quantized(source, root / "fp8", qc.fp8_blocks(BLOCK), config)


def make_llm(model_dir: Path, dtype: str) -> LLM:
    return LLM(str(model_dir), dtype=dtype, device="cuda", attention_backend="triton", block_size=16,
               kv_cache_blocks=512, max_num_seqs=16, max_num_batched_tokens=512)


def test_experts_stay_in_fp8_and_bf16_departs_no_more_than_the_reference(tiny_model_dirs: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """The reference quantizes the dense layers' activations per group of the blocks' columns, as they do (the
    experts keep theirs: weights-only). Its own bf16 run flips near ties against its float32 one far past the plain
    models' rate (an FP8 activation rounds a bf16 difference up to a whole FP8 step, and a flipped route follows), so
    ours is held to its record, over three checkpoints."""
    prompts = prompts_of_lengths(LENGTHS * 2)

    def runs() -> Iterator[tuple[Path, list[list[int]], list[GenerationOutput], References]]:
        for seed in range(3):
            quantized, dequantized = fp8_qwen3_moe(tmp_path / str(seed), tiny_model_dirs["qwen3"], seed)
            llm = make_llm(quantized, "bfloat16")
            experts = llm.engine.runner.model.model.layers[0].mlp.experts
            assert experts.quant is not None and experts.gate_up_proj.dtype == torch.float8_e4m3fn
            outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5))
            yield dequantized, prompts, outputs, partial(w8a8_reference, dequantized, BLOCK[1], None)

    assert_bf16_departs_no_more_than_transformers_over_checkpoints(runs())
