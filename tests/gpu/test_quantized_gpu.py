"""Quantized weights on the GPU: each GEMM kernel and each route of a layer against its format's reference over
1..512 rows (and inside a CUDA graph; where quant_tiles sends a product to the GEMV path, FP8 activations stay
unquantized), and whole models by the top-5 rule: weight-only formats (W4A16, GGUF blocks) against transformers' bf16
run of the checkpoint dequantized by the format's rule; W8A8 FP8 against the same with each linear layer's input
quantized as the format quantizes activations (the format's own rule for them), so the differences left are two bf16
implementations' roundings: held to the project's usual rate, or, for the formats whose near ties flip past it in
transformers' own bf16 model too, to the bf16 reference's record against its float32 one."""

import itertools
from functools import partial
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from transformers import AutoModelForCausalLM

from core import LLM, SamplingParams
from core.model_files.gguf_checkpoint import gguf_checkpoint
from gpu.kernels import f16x2
from gpu.kernels.device_tables import device_name
from gpu.kernels.quant_gemm_configs import (
    FP8_CUBLAS_MIN_ROWS,
    TABLES,
    GemvTiles,
    Tiles,
    WideGemvTiles,
    gemv_tiles,
    narrow_int4_tiles,
    quant_tiles,
    table_for,
    wide_gemv_tiles,
)
from gpu.layers.activation import GeluTanhAndMul, SiluAndMul
from gpu.layers.linear import Linear
from gpu.layers.norm import GEMMA3_NORM, LLAMA_NORM, NormInput, RMSNorm
from gpu.loader import CheckpointTensor, TensorSlice
from gpu.quant import gguf_blocks
from gpu.quant.fp8 import Fp8Scheme, dequantize_blocks
from gpu.quant.gguf import GgufScheme
from gpu.quant.int_weights import IntGroups, to_kernel_form
from tests import quant_checkpoints as qc
from tests.gpu.test_parity_gpu import (
    MAX_NEW,
    Reference,
    assert_bf16_departs_no_more_than_transformers,
    assert_bf16_divergences_rare_near_ties,
    greedy_and_logits,
)
from tests.parity.test_parity_cpu import prompts_of_lengths
from tests.parity.test_parity_quantized import FORMATS, tiny_gguf_of_every_type

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROWS = (1, 2, 3, 8, 16, 17, 64, 65, 100, 256, 512)
N, K = 1536, 2048


def _close(out: torch.Tensor, ref: torch.Tensor, tolerance: float = 1e-2) -> None:
    torch.testing.assert_close(out.float(), ref, rtol=tolerance, atol=tolerance * ref.abs().max().item())


def quantized_activations(x: torch.Tensor, group: int | None, static: torch.Tensor | None) -> torch.Tensor:
    """x as the FP8 kernels quantize it (per token group of `group` columns, per token for None, or with a static
    scale), dequantized, in float32."""
    rows = x.float()
    if static is not None:
        return (rows / static.float()).clamp(-448, 448).to(torch.float8_e4m3fn).float() * static.float()
    grouped = rows.view(rows.shape[0], -1, group or rows.shape[1])
    scale = (grouped.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-12)
    return ((grouped / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).view_as(rows)


def runs_gemv(rows: int, kind: str) -> bool:
    """Whether quant_tiles sends an [rows, K] x [N, K] product of `kind` to the GEMV path on this GPU."""
    from gpu.kernels.fp8_gemm import num_sms

    device = torch.device("cuda")
    return isinstance(quant_tiles(rows, N, K, kind, num_sms(device), table_for(device_name(device))),
                      GemvTiles | WideGemvTiles)


def test_the_rule_and_this_gpus_table_choose_the_path() -> None:
    """This GPU's table is the one its name gives; the tests' shape, in no table, takes the rule: the FP8 GEMV and the
    int4 wide row GEMV at one row (so the tests below run them there), the tensor cores at more rows and for int8 at
    any."""
    device = torch.device("cuda")
    assert device_name(device) == torch.cuda.get_device_name(device)
    for kind in ("fp8", "int4"):
        assert runs_gemv(1, kind) and not any(runs_gemv(rows, kind) for rows in (2, 4, 8))
    assert not any(runs_gemv(rows, "int8") for rows in (1, 2, 4, 8))


def fp8_activations(x: torch.Tensor, group: int | None, static: torch.Tensor | None) -> torch.Tensor:
    """x as the FP8 path its rows take multiplies it: unquantized on the GEMV path, else quantized_activations."""
    return x.float() if runs_gemv(x.shape[0], "fp8") else quantized_activations(x, group, static)


def _fp8_weight(block: tuple[int, int], g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    weight = torch.randn(N, K, device="cuda", generator=g) * 0.05
    scales = torch.rand(-(-N // block[0]), -(-K // block[1]), device="cuda", generator=g) * 1e-3 + 1e-4
    levels = (weight / dequantize_blocks(torch.ones_like(weight), scales, block)).clamp(-448, 448)
    return levels.to(torch.float8_e4m3fn), scales


@pytest.mark.parametrize("scheme", ["blocks", "per-row", "static"])
@pytest.mark.parametrize("rows", ROWS)
def test_fp8_kernel_against_the_reference(scheme: str, rows: int) -> None:
    from gpu.kernels.fp8_gemm import fp8_gemm

    g = torch.Generator(device="cuda").manual_seed(rows)
    block = (128, 128) if scheme == "blocks" else (1, K)
    levels, scales = _fp8_weight(block, g)
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    static = torch.tensor([0.02], device="cuda") if scheme == "static" else None
    bias = torch.randn(N, device="cuda", generator=g).bfloat16()
    out = fp8_gemm(x, levels, scales, block, static, bias)
    activations = fp8_activations(x, 128, static)  # per-row weights: groups of 128 too
    _close(out, activations @ dequantize_blocks(levels, scales, block).T + bias.float())


def _loaded(scheme: object, tensors: dict[str, torch.Tensor]) -> Linear:
    """A CUDA layer of `scheme`'s format holding `tensors`, ready for bf16 activations."""
    with torch.device("cuda"):
        layer = Linear(K, N, bias=False)
    layer.use_quant_method(scheme.method_for(["layer"], layer.weight_layout()))  # type: ignore[attr-defined]
    for name, tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, CheckpointTensor(name, TensorSlice(tensor.cpu())), None)
    layer.finish_loading(torch.bfloat16)
    return layer


def _fp8_layer(scheme: str, g: torch.Generator) -> tuple[Linear, torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(a layer of random FP8 weights, its levels, scales and scale block): 128x128 blocks ("blocks"), or a scale
    per channel with dynamic ("per-channel") or static ("static") activation scales."""
    block = (128, 128) if scheme == "blocks" else (1, K)
    levels, scales = _fp8_weight(block, g)
    if scheme == "blocks":
        return _loaded(Fp8Scheme({"quant_method": "fp8", "weight_block_size": [128, 128]}),
                       {"weight": levels, "weight_scale_inv": scales}), levels, scales, block
    config = {"quant_method": "fp8", "activation_scheme": "static" if scheme == "static" else "dynamic"}
    static = {"input_scale": torch.tensor([0.03])} if scheme == "static" else {}
    return _loaded(Fp8Scheme(config), {"weight": levels, "weight_scale": scales} | static), levels, scales, block


@pytest.mark.parametrize("scheme", ["blocks", "per-channel"])
@pytest.mark.parametrize("rows", ROWS)
def test_fp8_layer_routes_by_rows(scheme: str, rows: int) -> None:
    """Up to FP8_CUBLAS_MIN_ROWS the Triton kernel (activations per group of 128), from there cuBLAS (per group of
    128 for 128x128 blocks, per token for a scale per channel)."""
    g = torch.Generator(device="cuda").manual_seed(rows + 1)
    layer, levels, scales, block = _fp8_layer(scheme, g)
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    per_token = scheme == "per-channel" and rows >= FP8_CUBLAS_MIN_ROWS
    _close(layer(x), fp8_activations(x, None if per_token else 128, None) @ dequantize_blocks(levels, scales, block).T)


@pytest.mark.parametrize("scheme", ["blocks", "per-channel", "static"])
@pytest.mark.parametrize("rows", (FP8_CUBLAS_MIN_ROWS, 200, 512))
def test_fp8_layer_takes_its_input_quantized_from_the_norm_and_the_activation(scheme: str, rows: int) -> None:
    """On cuBLAS's rows the norm's and the gated activation's kernels write the FP8 input themselves
    (gpu/kernels/fp8_quant.py): the products and the residual sum equal the norm (or activation) run alone and then
    the layer, bit for bit, Llama's and Gemma's norm conventions, SiLU and GELU."""
    g = torch.Generator(device="cuda").manual_seed(rows + 2)
    layer = _fp8_layer(scheme, g)[0]
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    residual = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    for convention in (LLAMA_NORM, GEMMA3_NORM):
        norm = RMSNorm(K, 1e-6, convention=convention).cuda().bfloat16()
        norm.weight.data.normal_(generator=g)
        inp = NormInput(norm, x, residual)
        assert layer.quant.apply_normed(layer, inp, None) is not None  # type: ignore[union-attr]
        y, summed = layer.forward_normed(inp)
        normed, want_summed = inp.compute()
        assert torch.equal(y, layer(normed)) and torch.equal(summed, want_summed)
    gate_up = torch.randn(rows, 2 * K, device="cuda", generator=g).bfloat16()
    for act in (SiluAndMul(), GeluTanhAndMul()):
        assert layer.quant.apply_activated(layer, gate_up, act, None) is not None  # type: ignore[union-attr]
        assert torch.equal(layer.forward_activated(gate_up, act), layer(act(gate_up)))


def _int_groups(bits: int, group_size: int, kind: str, g: torch.Generator, n: int = N, k: int = K) -> IntGroups:
    levels = torch.randint(0, 1 << bits, (n, k), device="cuda", generator=g, dtype=torch.int32)
    scales = torch.rand(n, k // group_size, device="cuda", generator=g) * 0.01 + 1e-3
    zeros = torch.randint(0, 1 << bits, scales.shape, device="cuda", generator=g).float() if kind == "zeros" else None
    offsets = (torch.rand(scales.shape, device="cuda", generator=g) - 0.5) * 0.05 if kind == "offsets" else None
    group_ids = (torch.randperm(k, device="cuda", generator=g) // group_size).int() if kind == "act-order" else None
    return IntGroups(bits, levels, scales, zeros, group_ids, offsets=offsets)


@pytest.mark.parametrize(("bits", "group_size", "kind"), [
    (4, 128, "symmetric"), (4, 128, "zeros"), (4, 32, "act-order"), (4, 32, "offsets"), (8, 128, "symmetric"),
    (8, 16, "offsets")])
@pytest.mark.parametrize("rows", ROWS)
def test_int_kernel_against_the_reference(bits: int, group_size: int, kind: str, rows: int) -> None:
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(rows + bits)
    stored = to_kernel_form(_int_groups(bits, group_size, kind, g), torch.bfloat16)
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    out = torch.zeros(rows, N + 64, device="cuda", dtype=torch.bfloat16)
    int_gemm(x, stored, out=out[:, 32 : 32 + N])  # a column slice of a wider output, as merged layers write
    _close(out[:, 32 : 32 + N], x.float() @ stored.int_groups().dequantize().T)
    assert not out[:, :32].any() and not out[:, 32 + N :].any()


@pytest.mark.parametrize(("bits", "group_size", "kind"), [
    (4, 128, "zeros"), (4, 32, "act-order"), (4, 32, "offsets"), (8, 16, "offsets")])
def test_the_dequantized_weight_is_the_reference_rounded_once(bits: int, group_size: int, kind: str) -> None:
    """Many rows multiply the weight dequantized on cuBLAS: each weight computed in float32 and rounded once to x's
    dtype (a fused multiply-add may move a float32 result by its last bit, and so a rare rounding by one)."""
    from gpu.kernels.int_gemm import int_dequantized

    g = torch.Generator(device="cuda").manual_seed(bits + group_size)
    stored = to_kernel_form(_int_groups(bits, group_size, kind, g, n=320, k=512), torch.bfloat16)
    ours, reference = int_dequantized(stored, torch.bfloat16).float(), stored.int_groups().dequantize()
    ulp = reference.abs().clamp_min(1e-30) * 2.0**-7
    assert ((ours - reference.bfloat16().float()).abs() <= ulp).all()
    assert (ours != reference.bfloat16().float()).float().mean() < 1e-3


@pytest.mark.parametrize("rows", (1, 2, 3, 4, 8))
def test_gemv_tiles_of_the_rule_against_the_reference(rows: int) -> None:
    """The GEMV path at each row count a table may send to it, whatever the rule picks: FP8 blocks and per-row
    scales (activations unquantized), int4 with zero points, int8 with act order."""
    from gpu.kernels.fp8_gemm import fp8_gemm
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(rows + 7)
    x = torch.randn(rows, K, device="cuda", generator=g).bfloat16()
    bias = torch.randn(N, device="cuda", generator=g).bfloat16()
    for block in ((128, 128), (1, K)):
        levels, scales = _fp8_weight(block, g)
        _close(fp8_gemm(x, levels, scales, block, None, bias, tiles=gemv_tiles(rows, K, "fp8")),
               x.float() @ dequantize_blocks(levels, scales, block).T + bias.float())
    for bits, kind in ((4, "zeros"), (8, "act-order")):
        stored = to_kernel_form(_int_groups(bits, 128, kind, g), torch.bfloat16)
        _close(int_gemm(x, stored, bias, tiles=gemv_tiles(rows, K, f"int{bits}")),
               x.float() @ stored.int_groups().dequantize().T + bias.float())


@pytest.mark.parametrize("path", ["wide", "row"])
@pytest.mark.parametrize(("group_size", "kind"), [(128, "symmetric"), (128, "zeros"), (32, "offsets"), (16, "zeros")])
@pytest.mark.parametrize(("n", "k"), [(N, K), (1531, K), (640, 2560), (6144, 4096), (4096, 12288), (2048, 4096)])
def test_int4_row_gemv_against_the_reference(group_size: int, kind: str, n: int, k: int, path: str) -> None:
    """One row of 4-bit weights on the wide row GEMV's rule (gpu/kernels/int4_wide_gemv.py, K split for the narrowest
    N) and on the row GEMV's tiles (int4_row_gemv.py), in bf16: the tests' shape, a ragged N, K past the last whole
    tile, Qwen3-8B's qkv and down, Qwen3-30B-A3B's o_proj; with a bias, into a column slice of a wider output."""
    from gpu.kernels.fp8_gemm import num_sms
    from gpu.kernels.int4_row_gemv import takes_row_gemv
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(n + group_size)
    levels = torch.randint(0, 16, (n, k), device="cuda", generator=g, dtype=torch.int32)
    scales = torch.rand(n, k // group_size, device="cuda", generator=g) * 0.01 + 1e-3
    zeros = torch.randint(0, 16, scales.shape, device="cuda", generator=g).float() if kind == "zeros" else None
    offsets = (torch.rand(scales.shape, device="cuda", generator=g) - 0.5) * 0.05 if kind == "offsets" else None
    stored = to_kernel_form(IntGroups(4, levels, scales, zeros, offsets=offsets), torch.bfloat16)
    x = torch.randn(1, k, device="cuda", generator=g).bfloat16()
    bias = torch.randn(n, device="cuda", generator=g).bfloat16()
    assert takes_row_gemv(stored, x)
    tiles = wide_gemv_tiles(n, k, num_sms(x.device)) if path == "wide" else gemv_tiles(1, k, "int4")
    out = torch.zeros(1, n + 64, device="cuda", dtype=torch.bfloat16)
    int_gemm(x, stored, bias, out=out[:, 32 : 32 + n], tiles=tiles)
    _close(out[:, 32 : 32 + n], x.float() @ stored.int_groups().dequantize().T + bias.float())
    assert not out[:, :32].any() and not out[:, 32 + n :].any()


@pytest.mark.parametrize("m", range(1, 9))
@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 576), (3072, 576), (576, 1536)])
def test_a_verifying_steps_rows_of_4_bit_weights_against_the_reference(n: int, k: int, m: int) -> None:
    """The default model's products (Q4_1: groups of 32 with offsets) at a verifying step's 1..8 rows, x rows of a
    wider tensor, on the path and tiles int_gemm chooses on this GPU (its table's row GEMV, a row's own programs,
    where it has one)."""
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(n * m + k)
    levels = torch.randint(0, 16, (n, k), device="cuda", generator=g, dtype=torch.int32)
    scales = torch.rand(n, k // 32, device="cuda", generator=g) * 0.01 + 1e-3
    offsets = (torch.rand(scales.shape, device="cuda", generator=g) - 0.5) * 0.05
    stored = to_kernel_form(IntGroups(4, levels, scales, offsets=offsets), torch.bfloat16)
    x = torch.randn(m, k + 64, device="cuda", generator=g).bfloat16()[:, 32 : 32 + k]
    _close(int_gemm(x, stored), x.float() @ stored.int_groups().dequantize().T)


def _wide_sweep_tiles() -> list[WideGemvTiles]:
    """Every wide row GEMV tile the sweep (bench/kernels/skinny_gemm.py) tries, split in two too."""
    from bench.kernels.skinny_gemm import WIDE

    return [WideGemvTiles(rows, loads * warps << 10, warps, split, prefetch, in_order)
            for (rows, loads, warps), (prefetch, in_order), split in itertools.product(*WIDE, (1, 2))]


@pytest.mark.parametrize("k", [12288, 13312])
@pytest.mark.parametrize("tiles", _wide_sweep_tiles(), ids=repr)
def test_the_wide_sweeps_tiles_against_the_reference(tiles: WideGemvTiles, k: int) -> None:
    """Each tile the sweep may write into a table, at Qwen3-8B's down projection (K of whole tiles of every width)
    and past it by 1,024 columns (a partial last tile where tiles are wider) with zero points, x in bf16: its L2
    prefetches and in-order (volatile) loads, which Triton's interpreter skips or reads as plain loads, leave the
    product the reference's."""
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(tiles.block_k + tiles.block_n)
    n = 4096
    levels = torch.randint(0, 16, (n, k), device="cuda", generator=g, dtype=torch.int32)
    scales = torch.rand(n, k // 128, device="cuda", generator=g) * 0.01 + 1e-3
    zeros = torch.randint(0, 16, scales.shape, device="cuda", generator=g).float()
    stored = to_kernel_form(IntGroups(4, levels, scales, zeros), torch.bfloat16)
    x = torch.randn(1, k, device="cuda", generator=g).bfloat16()
    _close(int_gemm(x, stored, tiles=tiles), x.float() @ stored.int_groups().dequantize().T)


@pytest.mark.parametrize(("dtype", "x_scale", "outlier"), [
    (torch.bfloat16, 1e-6, None), (torch.bfloat16, 1.0, 1e5), (torch.bfloat16, 1e-2, 1e30),
    (torch.float16, 1e-5, None), (torch.float16, 1e-3, 6e4)])
@pytest.mark.parametrize("wide", [False, True])
def test_int4_row_gemv_past_float16s_range(dtype: torch.dtype, x_scale: float, outlier: float | None,
                                           wide: bool) -> None:
    """The row GEMVs' products are float16 (gpu/kernels/f16x2.py) of x scaled a chunk at a time into its range: x
    whose products fall below float16's normal range (bf16 10^-6, float16 10^-5), and outliers past it (bf16 10^5,
    10^30, as large activations have them) or at its edge, within float16's rounding of the exact product."""
    from gpu.kernels.int4_row_gemv import int4_row_gemv, takes_row_gemv
    from gpu.kernels.int4_wide_gemv import int4_wide_gemv

    g = torch.Generator(device="cuda").manual_seed(5)
    n, k = 4096, 12288
    levels = torch.randint(0, 16, (n, k), device="cuda", generator=g, dtype=torch.int32)
    scales = torch.rand(n, k // 128, device="cuda", generator=g) * 0.01 + 1e-3
    zeros = torch.randint(0, 16, scales.shape, device="cuda", generator=g).float()
    stored = to_kernel_form(IntGroups(4, levels, scales, zeros), dtype)
    x = torch.randn(1, k, device="cuda", generator=g) * x_scale
    if outlier is not None:
        x[0, ::997] = torch.linspace(-outlier, outlier, x[0, ::997].numel(), device="cuda")
    x = x.to(dtype)
    assert takes_row_gemv(stored, x)
    y = torch.empty(1, n, device="cuda")  # float32: the outliers' products pass float16's range summed over K
    if wide:
        int4_wide_gemv(x, stored, None, y, wide_gemv_tiles(n, k), False)
    else:
        int4_row_gemv(x, stored, None, y, gemv_tiles(1, k, "int4"), False)
    assert y.isfinite().all()
    _close(y, (x.double() @ stored.int_groups().dequantize().double().T).float(), 2e-3)


@pytest.mark.parametrize(("dtype", "x_scale", "outlier"), [(torch.bfloat16, 1.0, None), (torch.bfloat16, 1e-6, None),
                                                      (torch.bfloat16, 1e-2, 1e30), (torch.float16, 1.0, 6e4)])
@pytest.mark.parametrize("block", [(128, 128), (1, K)])
def test_fp8_row_gemv_against_the_reference(dtype: torch.dtype, x_scale: float, outlier: float | None,
                                            block: tuple[int, int]) -> None:
    """The one-row FP8 GEMV in packed float16 (gpu/kernels/fp8_row_gemv.py) at the rule's tiles, x of any
    magnitude, block scales and a scale per row: within bf16's rounding of the products' magnitudes."""
    from gpu.kernels.fp8_row_gemv import fp8_row_gemv, takes_fp8_row_gemv

    g = torch.Generator(device="cuda").manual_seed(int(x_scale * 100) + block[0])
    levels, scales = _fp8_weight(block, g)
    x = torch.randn(1, K, device="cuda", generator=g) * x_scale
    if outlier is not None:
        x[0, ::97] = torch.linspace(-outlier, outlier, x[0, ::97].numel(), device="cuda")
    x = x.to(dtype)
    group = block[1] if block[0] > 1 else None
    assert takes_fp8_row_gemv(x, levels, group)
    y = torch.empty(1, N, device="cuda")
    fp8_row_gemv(x, levels, scales, block[0], group, None, y, gemv_tiles(1, K, "fp8"), False)
    weight = dequantize_blocks(levels, scales, block).double()
    reference, magnitudes = x.double() @ weight.T, x.double().abs() @ weight.abs().T
    assert y.isfinite().all()
    assert ((y.double() - reference).abs() <= 2.0**-9 * magnitudes).all()


def test_f16x2_ptx_equals_its_twins() -> None:
    """gpu/kernels/f16x2.py's PTX and the twins Triton's interpreter runs instead give the same bits on random
    float16 pairs of every magnitude and every 4-bit level (tests/unit/f16x2_interpreted_cases.py holds the twins
    to a model of the PTX)."""
    size = 1 << 16
    g = torch.Generator(device="cuda").manual_seed(3)
    halves = [torch.randn(2 * size, device="cuda", generator=g) * torch.exp2(
        torch.randint(-20, 12, (2 * size,), device="cuda", generator=g).float()) for _ in range(3)]
    a, b, c = (h.half().view(torch.int32) for h in halves)
    v = halves[0][:size].contiguous()
    out = torch.zeros(2, 8, size, device="cuda", dtype=torch.int32)
    for i, twin in enumerate((False, True)):
        _f16x2_helpers_kernel[(size // 1024,)](a, b, c, v, out[i], size, TWIN=twin, BLOCK=1024)
    assert torch.equal(out[0], out[1])
    powers = torch.exp2(torch.randint(-40, 40, (2 * size,), device="cuda", generator=g).float())  # as x is scaled
    for is_bf16, dtype in ((True, torch.bfloat16), (False, torch.float16)):
        pairs = torch.zeros(2, 2, size, device="cuda", dtype=torch.int32)
        b = (powers if is_bf16 else powers.clamp(2.0**-12, 2.0**12)).to(dtype).view(torch.int32)
        for i, twin in enumerate((False, True)):
            _pair_ops_kernel[(size // 1024,)](halves[1].to(dtype).view(torch.int32), b, pairs[i], size, IS_BF16=is_bf16,
                                              TWIN=twin, BLOCK=1024)
        assert torch.equal(pairs[0], pairs[1]), dtype


def test_e4m3_ptx_equals_its_twin() -> None:
    """cvt.rn.f16x2.e4m3x2 and f16x2_of_e4m3x4's twin give the same bits for every non-NaN e4m3 code at every byte
    of a word, and both a NaN for the NaN codes (0x7F, 0xFF: NaNs of different bits, 0x7FFF and 0x7E00; weights are
    never NaN). The twin is held to torch's float8 -> float16 in tests/unit/f16x2_interpreted_cases.py."""
    size = 1 << 16
    words = torch.randint(-(1 << 31), 1 << 31, (size,), device="cuda", dtype=torch.int64).to(torch.int32)
    words[:64] = torch.arange(256, device="cuda", dtype=torch.uint8).view(torch.int32)  # each code in each byte
    words[64:128] = torch.arange(256, device="cuda", dtype=torch.uint8).roll(1).view(torch.int32)
    out = torch.zeros(2, 2, size, device="cuda", dtype=torch.int32)
    for i, twin in enumerate((False, True)):
        _e4m3_kernel[(size // 1024,)](words, out[i], size, TWIN=twin, BLOCK=1024)
    # [PTX or twin, word, byte]: pair p's low half converts byte 2p, its high half byte 2p + 1
    halves = out.view(torch.int16).view(2, 2, size, 2).permute(0, 2, 1, 3).reshape(2, size, 4)
    is_nan = (words.view(torch.uint8).view(size, 4) & 0x7F) == 0x7F
    assert is_nan.any() and (~is_nan).any()
    differs = (halves[0] != halves[1]) & ~is_nan
    codes = words.view(torch.uint8).view(size, 4)[differs]
    assert not differs.any(), (f"codes {codes.unique()[:16].tolist()}: PTX {halves[0][differs][:8].tolist()}, twin "
                               f"{halves[1][differs][:8].tolist()}")
    assert halves.view(torch.float16)[:, is_nan].isnan().all()


@triton.jit
def _e4m3_kernel(words_ptr, out_ptr, size, TWIN: tl.constexpr, BLOCK: tl.constexpr):
    """f16x2_of_e4m3x4 (its twin where TWIN) on a block of words, into rows of out."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    word = tl.load(words_ptr + offs)
    if TWIN:
        pair_0, pair_1 = f16x2.f16x2_of_e4m3x4_twin(word)
    else:
        pair_0, pair_1 = f16x2.f16x2_of_e4m3x4(word)
    tl.store(out_ptr + offs, pair_0)
    tl.store(out_ptr + size + offs, pair_1)


@triton.jit
def _pair_ops_kernel(a_ptr, b_ptr, out_ptr, size, IS_BF16: tl.constexpr, TWIN: tl.constexpr, BLOCK: tl.constexpr):
    """abs_max_x2 and mul_x2 (their twins where TWIN) on a block of pairs, into rows of out."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a, b = tl.load(a_ptr + offs), tl.load(b_ptr + offs)
    if TWIN:
        largest, product = f16x2.abs_max_x2_twin(a, b), f16x2.mul_x2_twin(a, b, IS_BF16)
    else:
        largest, product = f16x2.abs_max_x2(a, b, IS_BF16), f16x2.mul_x2(a, b, IS_BF16)
    tl.store(out_ptr + offs, largest)
    tl.store(out_ptr + size + offs, product)


@triton.jit
def _f16x2_helpers_kernel(a_ptr, b_ptr, c_ptr, v_ptr, out_ptr, size, TWIN: tl.constexpr, BLOCK: tl.constexpr):
    """Each f16x2 helper (its twin where TWIN) on a block of inputs, into rows of out."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a, b, c, v = tl.load(a_ptr + offs), tl.load(b_ptr + offs), tl.load(c_ptr + offs), tl.load(v_ptr + offs)
    if TWIN:
        fma, of_bf16, splat = f16x2.f16x2_fma_twin(a, b, c), f16x2.f16x2_of_bf16x2_twin(a), f16x2.f16x2_splat_twin(v)
        total = f16x2.f16x2_sum_twin(a)
        pair_0, pair_1, pair_2, pair_3 = f16x2.nibbles_less_zero_twin(a, b, c)
    else:
        fma, of_bf16, splat = f16x2.f16x2_fma(a, b, c), f16x2.f16x2_of_bf16x2(a), f16x2.f16x2_splat(v)
        total = f16x2.f16x2_sum(a)
        pair_0, pair_1, pair_2, pair_3 = f16x2.nibbles_less_zero(a, b, c)
    tl.store(out_ptr + offs, fma)
    tl.store(out_ptr + size + offs, of_bf16)
    tl.store(out_ptr + 2 * size + offs, splat)
    tl.store(out_ptr + 3 * size + offs, total.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 4 * size + offs, pair_0)
    tl.store(out_ptr + 5 * size + offs, pair_1)
    tl.store(out_ptr + 6 * size + offs, pair_2)
    tl.store(out_ptr + 7 * size + offs, pair_3)


TABLE_GEMVS = sorted({(kind, tiles) for table in TABLES.values() for (kind, *_), tiles in table.items()
                      if isinstance(tiles, GemvTiles)}, key=repr)


@pytest.mark.parametrize(("kind", "tiles"), TABLE_GEMVS)
def test_the_tables_gemv_tiles_against_the_reference(kind: str, tiles: GemvTiles) -> None:
    """Each GEMV tile a GPU's table holds, at its rows: FP8 blocks, int4 with zero points."""
    from gpu.kernels.fp8_gemm import fp8_gemm
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(tiles.rows)
    x = torch.randn(tiles.rows, K, device="cuda", generator=g).bfloat16()
    if kind == "fp8":
        levels, scales = _fp8_weight((128, 128), g)
        _close(fp8_gemm(x, levels, scales, (128, 128), None, None, tiles=tiles),
               x.float() @ dequantize_blocks(levels, scales, (128, 128)).T)
    else:
        stored = to_kernel_form(_int_groups(int(kind[3:]), 128, "zeros", g), torch.bfloat16)
        _close(int_gemm(x, stored, tiles=tiles), x.float() @ stored.int_groups().dequantize().T)


TABLE_INT4 = sorted({(rows, n, k, tiles) for table in TABLES.values() for (kind, rows, n, k), tiles in table.items()
                     if kind == "int4"}, key=repr)
# The narrow-tile rule at the default model's o_proj and down, which no table holds past 8 rows.
NARROW_INT4 = [(rows, n, k, narrow_int4_tiles(rows)) for rows in (16, 64, 256, 512)
               for n, k in ((576, 576), (576, 1536))]


@pytest.mark.parametrize(("rows", "n", "k", "tiles"), TABLE_INT4 + NARROW_INT4)
def test_the_tables_int4_entries_at_their_shapes(rows: int, n: int, k: int, tiles: Tiles) -> None:
    """Each int4 entry of a GPU's table at its own product and row bucket (and one row fewer), with the offsets of
    GGUF's Q4_1 in groups of 32 where K is no multiple of 128 (the default model's), else GPTQ's zero points."""
    from gpu.kernels.int_gemm import int_gemm

    g = torch.Generator(device="cuda").manual_seed(n + k + rows)
    group, kind = (128, "zeros") if k % 128 == 0 else (32, "offsets")
    stored = to_kernel_form(_int_groups(4, group, kind, g, n, k), torch.bfloat16)
    for m in {rows, max(1, rows - 1)}:
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        _close(int_gemm(x, stored, tiles=tiles), x.float() @ stored.int_groups().dequantize().T)


@pytest.mark.parametrize("kind", gguf_blocks.TYPES)
@pytest.mark.parametrize("rows", (1, 16, 100, 300))
def test_gguf_layer_against_the_reference(kind: str, rows: int) -> None:
    data = torch.from_numpy(np.ascontiguousarray(
        qc.random_gguf_blocks(N, K, getattr(gguf.GGMLQuantizationType, kind), seed=rows)))
    layer = _loaded(GgufScheme({"quant_method": "gguf", "tensor_types": {"layer": kind}}), {"qweight": data})
    x = torch.randn(rows, K, device="cuda").bfloat16()
    _close(layer(x), x.float() @ gguf_blocks.dequantize(data.cuda(), kind).T)


def test_kernels_replay_in_a_cuda_graph() -> None:
    g = torch.Generator(device="cuda").manual_seed(5)
    levels, scales = _fp8_weight((128, 128), g)
    fp8 = _loaded(Fp8Scheme({"quant_method": "fp8", "weight_block_size": [128, 128]}),
                  {"weight": levels, "weight_scale_inv": scales})
    from gpu.kernels.int_gemm import int_gemm

    stored = to_kernel_form(_int_groups(4, 128, "zeros", g), torch.bfloat16)
    one, few, many = (torch.randn(rows, K, device="cuda", generator=g).bfloat16() for rows in (1, 4, 128))

    def step() -> list[torch.Tensor]:  # FP8's GEMV at one row (the rule), int4's by its tiles (the wide one's, split
        # too); tensor cores, cuBLAS
        return [fp8(one), fp8(few), fp8(many), int_gemm(one, stored, tiles=gemv_tiles(1, K, "int4")),
                int_gemm(one, stored, tiles=WideGemvTiles(4, 1024, 1, 2, 2, True)), stored.product(one, None),
                stored.product(few, None), stored.product(many, None)]

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(c, e) for c, e in zip(captured, eager, strict=True))


PROMPTS = prompts_of_lengths((1, 7, 16, 17, 40, 100, 3, 64))


def _serve_bf16(model_dir: Path) -> LLM:
    return LLM(str(model_dir), dtype="bfloat16", device="cuda", kv_cache_blocks=256, max_num_seqs=16,
               max_num_batched_tokens=512)


def w8a8_reference(model_dir: Path, group: int | None, static: float | None,
                   dtype: torch.dtype = torch.bfloat16) -> Reference:
    """transformers' greedy run (in `dtype`) of the dequantized checkpoint with every decoder linear layer's input
    quantized to FP8 as the format says (per token group of `group` columns, or the static scale)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    scale = None if static is None else torch.tensor(static, device="cuda")
    for module in model.model.layers.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(
                lambda _, args: (quantized_activations(args[0].reshape(-1, args[0].shape[-1]), group, scale)
                                 .to(args[0].dtype).view_as(args[0]),))

    return lambda prompt: greedy_and_logits(model, prompt)


# Formats whose tiny checkpoints flip near ties past the usual rate between two bf16 implementations, transformers'
# own bf16 model against its float32 one included: W8A8 (an FP8 activation rounds a bf16 difference up to a whole FP8
# step), and AWQ's 4-bit weights (the kernel keeps a group's scale in bf16, an error shared by the group's weights,
# where transformers rounds each dequantized weight to bf16 on its own). GGUF's blocks, whose kernel keeps a group's
# scale and offset so, are held to the same rule by their own test below.
FLIP_OFTEN = {"fp8-blocks", "fp8-tensor-static", "awq"}


@pytest.mark.parametrize("name", ["fp8-blocks", "fp8-tensor-static", "gptq-int4-act-order", "awq"])
def test_quantized_models_by_the_top5_rule(name: str, tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    model, quantizer, config = FORMATS[name]
    quantized, dequantized = qc.write_quantized(tiny_model_dirs[model], tmp_path, quantizer, config)
    outputs = _serve_bf16(quantized).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                                      logprobs=5))
    references = None
    if name == "fp8-blocks":  # the test checkpoints' blocks are 32 columns wide: activation groups of 32
        references = partial(w8a8_reference, dequantized, config["weight_block_size"][1], None)  # type: ignore[index]
    elif name == "fp8-tensor-static":
        references = partial(w8a8_reference, dequantized, None, 0.05)
    if name in FLIP_OFTEN:
        assert_bf16_departs_no_more_than_transformers(dequantized, PROMPTS, outputs, references)
    else:
        assert_bf16_divergences_rare_near_ties(dequantized, PROMPTS, outputs)


def test_gguf_blocks_model_by_the_top5_rule(tmp_path: Path) -> None:
    path = tiny_gguf_of_every_type(tmp_path)
    blocks = gguf_checkpoint(path, tmp_path / "cache", "bfloat16", keep_blocks=True)
    dequantized = gguf_checkpoint(path, tmp_path / "cache", "float32")
    outputs = _serve_bf16(blocks).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=5))
    assert_bf16_departs_no_more_than_transformers(dequantized, PROMPTS, outputs)
