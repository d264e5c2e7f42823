"""Quantized weights on the GPU: each GEMM kernel against its format's reference over 1..512 rows (and inside a CUDA
graph), and whole models (W8A8 FP8, W4A16, GGUF blocks) by the top-5 rule against transformers' bf16 run of the
same checkpoint dequantized by the format's rule."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from core import LLM, SamplingParams
from core.model_files.gguf_checkpoint import gguf_checkpoint
from core.tiny_model import TinyModelSpec, build_tiny_model
from gpu.quant import gguf_blocks
from gpu.quant.fp8 import dequantize_blocks
from gpu.quant.int_weights import IntGroups, pack_columns
from tests import quant_checkpoints as qc
from tests.gguf_files import write_llama_gguf
from tests.gpu.test_parity_gpu import assert_bf16_divergences_rare_near_ties
from tests.parity.test_parity_cpu import prompts_of_lengths
from tests.parity.test_parity_quantized import FORMATS, GGUF_TYPES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROWS = (1, 2, 3, 8, 16, 17, 64, 100, 256, 512)
N, K = 1536, 2048


def _close(out: torch.Tensor, ref: torch.Tensor, tolerance: float = 1e-2) -> None:
    torch.testing.assert_close(out.float(), ref, rtol=tolerance, atol=tolerance * ref.abs().max().item())


def _fp8_activations(x: torch.Tensor, group: int | None, static: torch.Tensor | None) -> torch.Tensor:
    """x as the kernel quantizes it (per group of columns, per row, or with a static scale), dequantized."""
    rows = x.float()
    if static is not None:
        scale = static.float()
    else:
        grouped = rows.view(rows.shape[0], -1, group or rows.shape[1])
        scale = (grouped.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-12)
        return ((grouped / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).view_as(rows)
    return (rows / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale


@pytest.mark.parametrize("scheme", ["blocks", "per-token", "static"])
@pytest.mark.parametrize("rows", ROWS)
def test_fp8_gemm_against_the_reference(scheme: str, rows: int) -> None:
    from gpu.kernels.fp8_gemm import fp8_gemm

    g = torch.Generator(device="cuda").manual_seed(rows)
    weight = (torch.randn(N, K, device="cuda", generator=g) * 0.05)
    block = (128, 128) if scheme == "blocks" else (1, K)
    scales = torch.rand(-(-N // block[0]), -(-K // block[1]), device="cuda", generator=g) * 1e-3 + 1e-4
    levels = (weight / dequantize_blocks(torch.ones_like(weight), scales, block)).clamp(-448, 448).to(
        torch.float8_e4m3fn)
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    static = torch.tensor([0.02], device="cuda") if scheme == "static" else None
    bias = torch.randn(N, device="cuda", generator=g).bfloat16()
    out = fp8_gemm(x, levels, scales, block, static, bias)
    activations = _fp8_activations(x, 128 if scheme == "blocks" else None, static)
    _close(out, activations @ dequantize_blocks(levels, scales, block).T + bias.float())


@pytest.mark.parametrize(("bits", "group_size", "has_zeros", "has_group_ids"), [
    (4, 128, False, False), (4, 128, True, False), (4, 32, True, True), (8, 128, False, False)])
@pytest.mark.parametrize("rows", ROWS)
def test_int_gemm_against_the_reference(bits: int, group_size: int, has_zeros: bool, has_group_ids: bool,
                                        rows: int) -> None:
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(rows + bits)
    groups = K // group_size
    stored = IntGroups(
        bits, torch.randint(0, 1 << bits, (N, K), device="cuda", generator=g, dtype=torch.int32),
        (torch.rand(N, groups, device="cuda", generator=g) * 0.01 + 1e-3).bfloat16(),
        torch.randint(0, 1 << bits, (N, groups), device="cuda", generator=g).bfloat16() if has_zeros else None,
        (torch.randperm(K, device="cuda", generator=g) // group_size).int() if has_group_ids else None)
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    out = int_gemm(x, pack_columns(stored.levels, bits), stored.scales, stored.zeros, stored.group_ids, bits)
    _close(out, x.float() @ stored.dequantize().T)


@pytest.mark.parametrize("kind", gguf_blocks.TYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_gguf_gemm_against_the_reference(kind: str, rows: int) -> None:
    from gpu.kernels.gguf_gemm import gguf_gemm

    data = qc.random_gguf_blocks(N, K, getattr(gguf.GGMLQuantizationType, kind), seed=rows)
    blocks = torch.from_numpy(np.ascontiguousarray(data)).cuda()
    x = torch.randn(rows, K, device="cuda").bfloat16()
    out = torch.zeros(rows, N + 64, device="cuda", dtype=torch.bfloat16)
    gguf_gemm(x, blocks, kind, out=out[:, 32 : 32 + N])  # a column slice of a wider output, as merged layers write
    _close(out[:, 32 : 32 + N], x.float() @ gguf_blocks.dequantize(blocks.cpu(), kind).cuda().T)
    assert not out[:, :32].any() and not out[:, 32 + N :].any()


def test_kernels_replay_in_a_cuda_graph() -> None:
    from gpu.kernels.gguf_gemm import gguf_gemm
    from gpu.kernels.int_gemm import int_gemm

    x = torch.randn(4, K, device="cuda").bfloat16()
    words = torch.randint(-(2**31), 2**31 - 1, (N, K // 8), device="cuda", dtype=torch.int32)
    scales = torch.rand(N, K // 128, device="cuda").bfloat16() * 0.01
    blocks = torch.from_numpy(qc.random_gguf_blocks(N, K, gguf.GGMLQuantizationType.Q4_K, seed=1)).cuda()

    def step() -> torch.Tensor:
        return int_gemm(x, words, scales, None, None, 4) + gguf_gemm(x, blocks, "Q4_K")

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


PROMPTS = prompts_of_lengths((1, 7, 16, 17, 40, 100, 3, 64))


def _serve_bf16(model_dir: Path) -> LLM:
    return LLM(str(model_dir), dtype="bfloat16", device="cuda", kv_cache_blocks=256, max_num_seqs=16,
               max_num_batched_tokens=512)


@pytest.mark.parametrize("name", ["fp8-blocks", "fp8-tensor-static", "gptq-int4-act-order", "awq"])
def test_quantized_models_by_the_top5_rule(name: str, tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    model, quantizer, config = FORMATS[name]
    quantized, dequantized = qc.write_quantized(tiny_model_dirs[model], tmp_path, quantizer, config)
    outputs = _serve_bf16(quantized).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, logprobs=5))
    # FP8 activations round every product's input too (W8A8): more near-ties flip than between two bf16 runs.
    assert_bf16_divergences_rare_near_ties(dequantized, PROMPTS, outputs, 0.15 if name.startswith("fp8") else 0.05)


def test_gguf_blocks_model_by_the_top5_rule(tmp_path: Path) -> None:
    spec = TinyModelSpec(architecture="llama", hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                         intermediate_size=512, tie_word_embeddings=False, seed=3)
    source = build_tiny_model(tmp_path / "float", spec)
    types = {kind: getattr(gguf.GGMLQuantizationType, name) for kind, name in GGUF_TYPES.items()}
    path = write_llama_gguf(source, tmp_path / "tiny.gguf", types, blocks=qc.random_gguf_blocks)
    blocks = gguf_checkpoint(path, tmp_path / "cache", "bfloat16", keep_blocks=True)
    dequantized = gguf_checkpoint(path, tmp_path / "cache", "float32")
    outputs = _serve_bf16(blocks).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, logprobs=5))
    assert_bf16_divergences_rare_near_ties(dequantized, PROMPTS, outputs)
