"""MXFP4 experts on CUDA (gpu/kernels/fused_moe.py decoding gpu/quant/mxfp4.py's stored form in its loops): the kernel
against the torch reference on the exact dequantization, over row counts at gpt-oss-20b's shape and an odd one, in
bf16 (tests/gpu/test_fused_moe.py's tolerance: the weights decode exactly, so only the activations' roundings
differ) and float32 (exact products), and in a CUDA graph replayed on new routings; a tiny gpt-oss with MXFP4 experts
served with its experts kept in MXFP4, float32 tokens equal to transformers' on its own dequantization, bf16 leaving
transformers' float32 answers at more than near ties no more often than transformers' own bf16 model does."""

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import torch

from core import LLM, GenerationOutput, SamplingParams
from gpu.layers.moe import activation
from tests.gpu.graph_capture import captured
from tests.gpu.test_fused_moe import assert_close
from tests.gpu.test_parity_gpu import (
    LENGTHS,
    MAX_NEW,
    Reference,
    References,
    assert_bf16_departs_no_more_than_transformers_over_checkpoints,
    greedy_and_logits,
)
from tests.moe_cases import quantized_kernel_and_reference, random_mxfp4_experts, random_routing
from tests.parity.test_parity_cpu import prompts_of_lengths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels need CUDA")
fused_moe = pytest.importorskip("gpu.kernels.fused_moe")

ROW_COUNTS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 64, 100, 256, 512, 2048)
SHAPES = {"gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu"), "odd": (12, 3, 224, 96, "silu")}


@pytest.mark.parametrize("shape", SHAPES)
def test_mxfp4_experts_match_the_reference_over_row_counts(shape: str) -> None:
    num_experts, top_k, hidden, intermediate, act = SHAPES[shape]
    experts = random_mxfp4_experts(num_experts, hidden, intermediate, act, device="cuda")
    for num_tokens in ROW_COUNTS:
        x = torch.randn(num_tokens, hidden, device="cuda", generator=torch.Generator("cuda").manual_seed(num_tokens))
        routed = random_routing(num_tokens, num_experts, top_k, "cuda", seed=num_tokens, skewed=num_tokens % 2 == 1)
        out, reference = quantized_kernel_and_reference(experts, x.bfloat16(), routed)
        assert_close(out, reference, torch.bfloat16)


@pytest.mark.parametrize("num_tokens", [1, 7, 64, 300, 2048])
def test_float32_products_are_exact(num_tokens: int) -> None:
    experts = random_mxfp4_experts(16, 256, 128, "clamped_swiglu", device="cuda")
    x = torch.randn(num_tokens, 256, device="cuda")
    out, reference = quantized_kernel_and_reference(experts, x, random_routing(num_tokens, 16, 4, "cuda"))
    assert_close(out, reference, torch.float32)


@pytest.mark.parametrize("num_tokens", [1, 8, 64])
def test_mxfp4_experts_in_a_cuda_graph_follow_new_inputs(num_tokens: int) -> None:
    num_experts, top_k, hidden, intermediate, act = SHAPES["gpt-oss-20b"]
    experts = random_mxfp4_experts(num_experts, hidden, intermediate, act, device="cuda")
    biases = (experts.gate_up_proj_bias.bfloat16(), experts.down_proj_bias.bfloat16())
    x = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device="cuda")
    routed = random_routing(num_tokens, num_experts, top_k, "cuda")

    def step() -> torch.Tensor:
        gate_up = fused_moe.Mxfp4Weights(experts.gate_up_proj_blocks, experts.gate_up_proj_scales)
        down = fused_moe.Mxfp4Weights(experts.down_proj_blocks, experts.down_proj_scales)
        return fused_moe.fused_experts(x, gate_up, down, routed.weights, routed.expert_ids, activation(experts.spec),
                                       *biases, use_pdl=True)

    x.normal_()
    graph, out = captured(step)
    for seed in range(3):
        fresh = random_routing(num_tokens, num_experts, top_k, "cuda", seed=seed + 1)
        routed.weights.copy_(fresh.weights)
        routed.expert_ids.copy_(fresh.expert_ids)
        x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        assert torch.equal(out, step())


def mxfp4_gpt_oss_of(root: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A tiny gpt-oss (random weights of `seed`) with its experts written in MXFP4."""
    from tests.moe_models import build_moe_model
    from tests.mxfp4_checkpoints import write_mxfp4_gpt_oss

    return write_mxfp4_gpt_oss(build_moe_model(root / "float", "gpt_oss", tokenizer_dir, seed=seed), root / "mxfp4")


@pytest.fixture(scope="module")
def mxfp4_gpt_oss(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mxfp4_gpt_oss_of(tmp_path_factory.mktemp("mxfp4-gpu"), tiny_model_dirs["qwen3"])


def transformers_dequantized(checkpoint: Path, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' model of the checkpoint in `dtype`: on CUDA some versions dequantize the experts to bf16 whatever
    the dtype asked, so its parameters are cast to it (exact: MXFP4 values fit bf16; buffers such as RoPE's stay)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=Mxfp4Config(dequantize=True),
                                                 dtype=dtype).cuda().eval()
    for param in model.parameters():
        param.data = param.data.to(dtype)
    return model


def transformers_reference(checkpoint: Path, dtype: torch.dtype) -> Reference:
    model = transformers_dequantized(checkpoint, dtype)
    return lambda prompt: greedy_and_logits(model, prompt)


def make_llm(model_dir: Path, dtype: str) -> LLM:
    return LLM(str(model_dir), dtype=dtype, device="cuda", attention_backend="triton", block_size=16,
               kv_cache_blocks=512, max_num_seqs=16, max_num_batched_tokens=512)


def test_experts_stay_in_mxfp4_and_float32_tokens_match_transformers(mxfp4_gpt_oss: Path) -> None:
    llm = make_llm(mxfp4_gpt_oss, "float32")
    experts = llm.engine.runner.model.model.layers[0].mlp.experts
    assert experts.quant is not None and experts.gate_up_proj_blocks.dtype == torch.uint8
    prompts = prompts_of_lengths(LENGTHS, shared_prefix=20)
    hf = transformers_dequantized(mxfp4_gpt_oss, torch.float32)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == greedy_and_logits(hf, prompt)[0]


def test_bf16_departs_from_float32_no_more_than_transformers_bf16(mxfp4_gpt_oss: Path,
                                                                  tiny_model_dirs: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """The tiny gpt-oss is router-sensitive: transformers' own bf16 model leaves its float32 answers at more than near
    ties on some prompts (a top-2 choice of experts flips on bf16 rounding, and the rest of the answer follows), so
    ours is held to that model's record, over three checkpoints."""
    prompts = prompts_of_lengths(LENGTHS * 2)

    def runs() -> Iterator[tuple[Path, list[list[int]], list[GenerationOutput], References]]:
        for seed in range(3):
            checkpoint = mxfp4_gpt_oss if seed == 0 else mxfp4_gpt_oss_of(tmp_path / str(seed),
                                                                           tiny_model_dirs["qwen3"], seed)
            outputs = make_llm(checkpoint, "bfloat16").generate(
                prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5))
            yield checkpoint, prompts, outputs, partial(transformers_reference, checkpoint)

    assert_bf16_departs_no_more_than_transformers_over_checkpoints(runs())
