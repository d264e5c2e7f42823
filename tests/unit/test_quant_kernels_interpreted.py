"""The quantized GEMM kernels (gpu/kernels/int_gemm.py, fp8_gemm.py, fp8_quant.py, and quant_gemv.py through the
first two) run by Triton's interpreter on the CPU against their formats' reference dequantization: unpacking, group
scales, zero points and offsets, act order, block scales, split-K, rows and columns past the tiles' edges; and
quant_gemm_configs.py's choice of path. float16 activations (the interpreter's
bfloat16 dot is not numpy's; tests/gpu/test_quantized_gpu.py checks bf16 on CUDA). The interpreter rounds some
floats to FP8 a binade off, so the FP8 kernels' activations here lie on the FP8 grid (each group's largest value
448 times a power of two): quantizing them is exact, and the product must equal the dequantized one."""

import importlib.util
import itertools
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from gpu.kernels.quant_gemm_configs import (
    GEMV_MAX_SUMS,
    INT_CUBLAS_MIN_ROWS,
    NARROW_INT4_MAX_ROWS,
    NARROW_INT4_MAX_WEIGHTS,
    SMALL_INT4_MAX,
    TABLES,
    WIDE_MIN_WARPS,
    GemvTiles,
    QuantTiles,
    WideGemvTiles,
    gemv_tiles,
    narrow_int4_tiles,
    quant_tiles,
    small_int4_tiles,
    table_for,
    tensor_core_tiles,
    wide_gemv_tiles,
)
from gpu.kernels.skinny_gemm_configs import row_bucket
from gpu.quant import gguf_blocks
from gpu.quant.fp8 import dequantize_blocks
from gpu.quant.int_weights import IntGroups, IntWeight, to_kernel_form

pytest.importorskip("triton")

KERNELS = Path(__file__).resolve().parents[2] / "gpu" / "kernels"
SPLIT_TILES = QuantTiles(block_m=16, block_n=16, block_k=128, split_k=2, num_warps=4, num_stages=2)


def interpreted(name: str) -> ModuleType:
    """gpu/kernels/<name>.py loaded afresh with TRITON_INTERPRET=1, with the kernels it imports loaded likewise."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.startswith("gpu.kernels.")}
        try:
            spec = importlib.util.spec_from_file_location(f"{name}_interpreted", KERNELS / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            for m in [m for m in sys.modules if m.startswith("gpu.kernels.")]:
                del sys.modules[m]
            sys.modules.update(saved)
    return module


@pytest.fixture(scope="module")
def int_kernel() -> ModuleType:
    return interpreted("int_gemm")


@pytest.fixture(scope="module")
def fp8_kernel() -> ModuleType:
    return interpreted("fp8_gemm")


@pytest.fixture(scope="module")
def fp8_quant() -> ModuleType:
    return interpreted("fp8_quant")


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """float16 outputs: a rounding of the result's magnitude apart."""
    torch.testing.assert_close(out.float(), ref, rtol=2e-3, atol=2e-3 * (ref.abs().max().item() + 1))


def _int_groups(bits: int, group_size: int, kind: str, n: int, k: int, g: torch.Generator) -> IntGroups:
    levels = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int32)
    scales = torch.rand(n, k // group_size, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 1 << bits, scales.shape, generator=g).float() if kind == "zeros" else None
    zeros = torch.full(scales.shape, 5.0) if kind == "equal-zeros" else zeros
    offsets = (torch.rand(scales.shape, generator=g) - 0.5) * 0.1 if kind == "offsets" else None
    group_ids = (torch.randperm(k, generator=g) // group_size).to(torch.int32) if kind == "act-order" else None
    return IntGroups(bits, levels, scales, zeros, group_ids, offsets=offsets)


@pytest.mark.parametrize(("bits", "group_size", "kind", "m", "n", "k", "tiles"), [
    (4, 128, "symmetric", 3, 40, 256, None), (4, 32, "zeros", 17, 24, 512, None),
    (4, 64, "equal-zeros", 2, 8, 128, None), (4, 128, "zeros", 2, 16, 512, SPLIT_TILES),
    (4, 32, "offsets", 2, 24, 256, SPLIT_TILES),
    (4, 128, "act-order", 1, 8, 1024, None),
    (4, 32, "symmetric", 2, 8, 64, None), (8, 64, "zeros", 2, 16, 128, None),
    (8, 16, "offsets", 5, 20, 384, SPLIT_TILES), (8, 64, "act-order", 1, 16, 256, SPLIT_TILES),
    (4, 32, "offsets", 5, 40, 576, SPLIT_TILES),  # K past the split's tiles; the default model's Q4_1 products
    (4, 32, "offsets", 8, 40, 576, replace(SPLIT_TILES, split_k=1, num_warps=2))])
def test_int_gemm_equals_the_dequantized_product(int_kernel: ModuleType, bits: int, group_size: int, kind: str,
                                                 m: int, n: int, k: int, tiles: QuantTiles | None) -> None:
    g = torch.Generator().manual_seed(bits * n + k)
    groups = _int_groups(bits, group_size, kind, n, k, g)
    stored = to_kernel_form(groups, torch.float16)
    assert (stored.perm is not None) == (kind == "act-order")
    assert (stored.zeros is not None) == (kind == "zeros")  # zeros equal everywhere: the constant
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    out = torch.zeros(m, n + 8, dtype=torch.float16)
    int_kernel.int_gemm(x, stored, bias, out=out[:, 4 : 4 + n], tiles=tiles)  # a column slice, as merged layers write
    _close(out[:, 4 : 4 + n], x.float() @ stored.int_groups().dequantize().T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()
    # the kernel form is the checkpoint's rule, its scales rounded to float16
    torch.testing.assert_close(stored.int_groups().dequantize(), groups.dequantize(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("bits", "group_size", "kind"), [
    (4, 128, "symmetric"), (4, 32, "zeros"), (4, 32, "offsets"), (4, 64, "act-order"), (8, 16, "offsets")])
def test_many_rows_multiply_the_weight_dequantized_once(int_kernel: ModuleType, bits: int, group_size: int,
                                                        kind: str) -> None:
    """From INT_CUBLAS_MIN_ROWS rows: the weight dequantized (float32, rounded once, in x's column order), then a
    plain matmul; bias added."""
    g = torch.Generator().manual_seed(bits + group_size)
    n, k, m = 40, 256, INT_CUBLAS_MIN_ROWS
    stored = to_kernel_form(_int_groups(bits, group_size, kind, n, k, g), torch.float16)
    reference = stored.int_groups().dequantize()
    dequantized = int_kernel.int_dequantized(stored, torch.float16)
    assert (dequantized.float() - reference.half().float()).abs().max() <= reference.abs().max() * 2.0**-10
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    out = torch.zeros(m, n + 8, dtype=torch.float16)
    int_kernel.int_gemm(x, stored, bias, out=out[:, 4 : 4 + n])  # a column slice, as merged layers write
    _close(out[:, 4 : 4 + n], x.float() @ reference.T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()


@pytest.mark.parametrize("kind", gguf_blocks.TYPES)
def test_gguf_blocks_through_the_int_kernel(int_kernel: ModuleType, kind: str) -> None:
    import gguf

    from tests.quant_checkpoints import random_gguf_blocks

    n, k = 20, 512
    blocks = random_gguf_blocks(n, k, getattr(gguf.GGMLQuantizationType, kind), seed=len(kind))
    stored = to_kernel_form(gguf_blocks.int_groups(torch.from_numpy(np.ascontiguousarray(blocks)), kind),
                            torch.float16)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(7)).half()
    out = int_kernel.int_gemm(x, stored, tiles=SPLIT_TILES)
    _close(out, x.float() @ stored.int_groups().dequantize().T)
    gemv = int_kernel.int_gemm(x[:3], stored, tiles=_gemv_tiles(int_kernel, "rows2"))  # the few-row path
    _close(gemv, x[:3].float() @ stored.int_groups().dequantize().T)
    one_row = int_kernel.int_gemm(x[:1], stored)  # the rule: 4-bit types in the row GEMV
    _close(one_row, x[:1].float() @ stored.int_groups().dequantize().T)


def _fp8_grid(m: int, k: int, group: int, g: torch.Generator) -> torch.Tensor:
    """Activations each of whose groups quantizes exactly: FP8 levels, the group's largest 448, times 2^e."""
    levels = (torch.randn(m, k // group, group, generator=g) * 100).clamp(-440, 440).to(torch.float8_e4m3fn).float()
    levels[:, :, 0] = 448.0
    return (levels * torch.exp2(torch.randint(-6, 3, (m, k // group, 1), generator=g).float())).view(m, k).half()


@pytest.mark.parametrize(("m", "n", "k", "block", "static", "tiles"), [
    (3, 40, 256, (32, 32), None, None), (5, 48, 384, (1, 384), None, None), (2, 24, 128, (1, 128), 0.25, None),
    (20, 64, 512, (128, 128), None, SPLIT_TILES), (1, 16, 320, (16, 64), None, SPLIT_TILES)])
def test_fp8_gemm_equals_the_dequantized_product(fp8_kernel: ModuleType, m: int, n: int, k: int,
                                                 block: tuple[int, int], static: float | None,
                                                 tiles: QuantTiles | None) -> None:
    g = torch.Generator().manual_seed(m * n + k)
    weight = torch.randn(n, k, generator=g) * 0.05
    scales = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 1e-3 + 1e-4
    levels = (weight / dequantize_blocks(torch.ones_like(weight), scales, block)).clamp(-448, 448).to(
        torch.float8_e4m3fn)
    if static is None:
        x = _fp8_grid(m, k, block[1] if block[1] < k else 128, g)
    else:
        x = ((torch.randn(m, k, generator=g) * 100).clamp(-440, 440).to(torch.float8_e4m3fn).float() * static).half()
    bias = torch.randn(n, generator=g).half()
    out = fp8_kernel.fp8_gemm(x, levels, scales, block, None if static is None else torch.tensor([static]), bias,
                              tiles=tiles)
    _close(out, x.float() @ dequantize_blocks(levels, scales, block).T + bias.float())


@pytest.mark.parametrize("group", [128, None, "static"])
def test_activation_quantization_for_cublas(fp8_quant: ModuleType, group: int | str | None) -> None:
    g = torch.Generator().manual_seed(3)
    m, k = 6, 2304
    static = torch.tensor([0.5]) if group == "static" else None
    x = _fp8_grid(m, k, k if group is None else 128, g) if static is None else \
        ((torch.randn(m, k, generator=g) * 100).clamp(-440, 440).to(torch.float8_e4m3fn).float() * 0.5).half()
    quantized, scales = fp8_quant.quantize_rows(x, group if isinstance(group, int) else None, static)
    if isinstance(group, int):  # cuBLAS's 1x128 layout: M-major, M in whole sets of 4 rows (zeros past x's)
        assert scales.shape == (8, k // group) and scales.stride() == (1, 8) and quantized.shape == (8, k)
        assert not quantized[m:].float().any()
        quantized, expanded = quantized[:m], scales[:m].repeat_interleave(group, 1)
    else:
        assert scales.shape == (m, 1)
        expanded = scales
    assert torch.equal(quantized.float() * expanded, x.float())


@pytest.fixture(scope="module")
def norm_kernel() -> ModuleType:
    return interpreted("rms_norm")


@pytest.fixture(scope="module")
def activation_kernel() -> ModuleType:
    return interpreted("silu_and_mul")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _assert_same_quantization(fused: tuple[torch.Tensor, ...], apart: tuple[torch.Tensor, ...]) -> None:
    for got, want in zip(fused, apart, strict=True):
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("group", [128, None, "static"])
@pytest.mark.parametrize(("hidden", "has_residual", "gemma"), [(384, True, False), (256, False, False),
                                                               (512, True, True)])
def test_norm_quantized_in_one_kernel_equals_the_norm_then_quantize_rows(
        fp8_quant: ModuleType, norm_kernel: ModuleType, group: int | str | None, hidden: int, has_residual: bool,
        gemma: bool) -> None:
    """The fused norm's FP8 rows, scales (padded rows included) and residual sum equal, bit for bit, the norm
    kernel's output quantized by quantize_rows: 5 rows (3 padding rows for groups), a hidden size off a power of two,
    Gemma's convention."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(5, hidden, generator=g) * 3).half()
    residual = torch.randn(5, hidden, generator=g).half() if has_residual else None
    weight = torch.randn(hidden, generator=g).half()
    static = torch.tensor([0.02]) if group == "static" else None
    size = group if isinstance(group, int) else None
    offset, in_float32 = (1.0, True) if gemma else (0.0, False)
    normed, summed = norm_kernel.rms_norm(x, weight, 1e-6, residual, weight_offset=offset,
                                          scales_in_float32=in_float32)
    apart = (*fp8_quant.quantize_rows(normed, size, static), summed)
    fused = fp8_quant.rms_norm_quantized(x, weight, 1e-6, residual, size, static, weight_offset=offset,
                                         scales_in_float32=in_float32)
    _assert_same_quantization(fused, apart)
    assert static is not None or fused[0].float().abs().amax() == 448  # some value on each scale's largest level


@pytest.mark.parametrize("group", [128, None, "static"])
@pytest.mark.parametrize(("intermediate", "activation"), [(1280, "silu"), (256, "gelu_tanh")])
def test_activation_quantized_in_one_kernel_equals_the_activation_then_quantize_rows(
        fp8_quant: ModuleType, activation_kernel: ModuleType, group: int | str | None, intermediate: int,
        activation: str) -> None:
    """The fused gated activation's FP8 rows and scales equal the activation kernel's output quantized by
    quantize_rows, bit for bit: one column block and a partial second (1,280 columns in tiles of 1,024), both
    activations, a strided input."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(6, 2 * intermediate + 8, generator=g) * 2).half()[:, : 2 * intermediate]
    static = torch.tensor([0.01]) if group == "static" else None
    size = group if isinstance(group, int) else None
    apart = fp8_quant.quantize_rows(activation_kernel.gated_activation(x, activation), size, static)
    _assert_same_quantization(fp8_quant.gated_activation_quantized(x, activation, size, static), apart)


GEMV_TILES = {"rows1": GemvTiles(1, 4, 256, 4), "rows2": GemvTiles(2, 8, 128, 4), "rows1-short": GemvTiles(1, 4, 64, 2),
              "rows2-ahead": GemvTiles(2, 2, 128, 1, ahead=True), "rows4-ahead": GemvTiles(4, 1, 64, 2, ahead=True)}


def _gemv_tiles(kernel: ModuleType, name: str | None) -> object:
    """GEMV_TILES[name] as the interpreted module's own class (it imported quant_gemm_configs afresh), or None."""
    return None if name is None else kernel.GemvTiles(**GEMV_TILES[name].__dict__)


@pytest.mark.parametrize(("bits", "group_size", "kind", "m", "n", "k", "tiles"), [
    (4, 128, "symmetric", 1, 13, 320, "rows1"), (4, 128, "zeros", 2, 9, 320, "rows2"),
    (4, 32, "zeros", 3, 9, 256, "rows2"), (4, 64, "act-order", 2, 8, 192, "rows1"),
    (4, 32, "offsets", 1, 6, 128, "rows1"), (8, 32, "offsets", 3, 7, 160, "rows2"),
    (8, 128, "symmetric", 2, 5, 128, "rows1-short"), (8, 32, "act-order", 1, 4, 96, "rows1-short"),
    (4, 32, "offsets", 3, 9, 320, "rows4-ahead"), (4, 64, "act-order", 2, 8, 192, "rows2-ahead"),
    (8, 32, "zeros", 4, 7, 160, "rows4-ahead"), (4, 128, "zeros", 2, 5, 256, "rows2-ahead")])
def test_int_gemv_equals_the_dequantized_product(int_kernel: ModuleType, bits: int, group_size: int, kind: str,
                                                 m: int, n: int, k: int, tiles: str) -> None:
    """Odd N, K past the last whole group (a group of its own, as the rule's group ids say) and past the tile, rows
    past the row tile, biases (the GEMV by its tiles, as a table or the small products' rule picks them), with the
    next tile's x and group values loaded ahead or not."""
    g = torch.Generator().manual_seed(bits * n + k)
    num_groups = -(-k // group_size)
    groups = _int_groups(bits, group_size, kind, n, num_groups * group_size, g)
    groups.levels = groups.levels[:, :k]
    if kind != "act-order":  # K past the last whole group: a group of fewer columns
        groups.group_ids = (torch.arange(k) // group_size).to(torch.int32)
    stored = to_kernel_form(groups, torch.float16)
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    out = torch.zeros(m, n + 8, dtype=torch.float16)
    int_kernel.int_gemm(x, stored, bias, out=out[:, 4 : 4 + n], tiles=_gemv_tiles(int_kernel, tiles))
    _close(out[:, 4 : 4 + n], x.float() @ groups.dequantize().T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()


@pytest.mark.parametrize(("m", "n", "k", "block", "static", "tiles"), [
    (1, 13, 320, (16, 64), None, "rows1"), (2, 40, 256, (32, 32), None, "rows2"),
    (3, 24, 384, (1, 384), 0.25, "rows2"), (2, 9, 336, (128, 128), None, "rows1"), (1, 20, 200, (128, 128), None, None),
    (3, 7, 96, (1, 96), None, "rows1-short")])
def test_fp8_gemv_equals_the_dequantized_product_with_activations_unquantized(
        fp8_kernel: ModuleType, m: int, n: int, k: int, block: tuple[int, int], static: float | None,
        tiles: str | None) -> None:
    """The GEMV path multiplies x as it is (a static activation scale plays no part): any x, not only the FP8
    grid, gives the dequantized weight's product."""
    g = torch.Generator().manual_seed(m * n + k)
    weight = torch.randn(n, k, generator=g) * 0.05
    scales = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 1e-3 + 1e-4
    levels = (weight / dequantize_blocks(torch.ones_like(weight), scales, block)).clamp(-448, 448).to(
        torch.float8_e4m3fn)
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    assert tiles is not None or isinstance(quant_tiles(m, n, k, "fp8"), GemvTiles)
    out = fp8_kernel.fp8_gemm(x, levels, scales, block, None if static is None else torch.tensor([static]), bias,
                              tiles=_gemv_tiles(fp8_kernel, tiles))
    _close(out, x.float() @ dequantize_blocks(levels, scales, block).T + bias.float())


def test_gemv_rule_fp8_and_int4_at_one_row_and_small_int4_products_at_few() -> None:
    """FP8 and int4 at one row take the GEMV rules' tiles (int4's the wide row GEMV's where K spans two of its tiles,
    else the row GEMV's); more rows, and int8 at any, the tensor-core rule, but small int4 products at 2..8 rows
    (rows x N x K up to SMALL_INT4_MAX: the default model's at a verifying step's rows, but its gate_up at 4 and 8
    and down at 8), which take quant_gemv's one weight row a program."""
    for n, k in ((4096, 4096), (6144, 4096), (4096, 12288), (24576, 4096), (20, 200), (960, 576), (576, 1536),
                 (3072, 576), (5120, 2048), (1536, 2048)):
        assert quant_tiles(1, n, k, "fp8") == gemv_tiles(1, k, "fp8")
        is_wide = k >= 2 * 2048  # two of the wide GEMV's tiles: the 8B products, not the default model's or A3B's qkv
        assert quant_tiles(1, n, k, "int4") == (wide_gemv_tiles(n, k) if is_wide else gemv_tiles(1, k, "int4"))
        for rows in (2, 3, 4, 8, 16):
            assert quant_tiles(rows, n, k, "fp8") == tensor_core_tiles(rows, n, k, "fp8")
            is_small = rows <= 8 and row_bucket(rows) * n * k <= SMALL_INT4_MAX
            is_narrow = rows > 8 and n * k < NARROW_INT4_MAX_WEIGHTS
            assert quant_tiles(rows, n, k, "int4") == (
                small_int4_tiles(rows, k) if is_small else narrow_int4_tiles(rows) if is_narrow
                else tensor_core_tiles(rows, n, k, "int4")), (rows, n, k)
        for rows in (1, 2, 4, 8):
            assert quant_tiles(rows, n, k, "int8") == tensor_core_tiles(rows, n, k, "int8")
    smol = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o_proj, gate_up, down
    assert [[isinstance(quant_tiles(rows, n, k, "int4"), GemvTiles) for n, k in smol] for rows in (2, 4, 8)] == [
        [True, True, True, True], [True, True, False, True], [True, True, False, False]]


def test_small_int4_products_past_8_rows_take_narrow_tiles_up_to_a_bound() -> None:
    """The default model's products at a verifying step's or a batch's rows: 16 weight rows by 32 rows of x (64 past
    256), no split; a prefill chunk's rows past NARROW_INT4_MAX_ROWS, and larger products, the tensor-core rule."""
    for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536)):
        for rows, block_m in ((9, 16), (16, 16), (17, 32), (64, 32), (256, 32), (257, 64), (512, 64)):
            assert quant_tiles(rows, n, k, "int4") == QuantTiles(block_m, 16, 128, 1, 4, 3), (rows, n, k)
        assert quant_tiles(NARROW_INT4_MAX_ROWS + 1, n, k, "int4") == tensor_core_tiles(513, n, k, "int4")
    assert quant_tiles(64, 1024, 2048, "int4") == tensor_core_tiles(64, 1024, 2048, "int4")  # Qwen3-0.6B's o_proj


def test_gemv_tiles_hold_their_sums_in_registers() -> None:
    """The GEMV rule's tiles at every row count a table may send to the GEMV; the row GEMV's (int4, one row) hold a
    sum per row and 32 columns, 4 rows at most, and give every warp of it 32 x 32 columns."""
    for kind, rows in itertools.product(("fp8", "int4", "int8"), range(1, 9)):
        t = gemv_tiles(rows, 4096, kind)
        if kind == "int4" and rows == 1:  # each thread all the rows of its 32 columns; a warp per 32 x 32 columns
            assert t.rows == 1 and t.block_n <= 4 and t.block_k >= 1024 * t.num_warps, t
            continue
        assert t.rows >= rows and t.rows * t.block_n * t.block_k <= GEMV_MAX_SUMS * 32 * t.num_warps
    assert gemv_tiles(1, 96, "fp8").block_k == 128  # within K's power of two


def test_the_table_overrides_the_rule_for_its_key_only() -> None:
    tensor_cores = QuantTiles(16, 128, 256, 4, 4, 3)
    gemv = GemvTiles(8, 4, 256, 4)
    table = {("fp8", 1, 4096, 4096): tensor_cores, ("int4", 8, 6144, 4096): gemv}
    assert quant_tiles(1, 4096, 4096, "fp8", table=table) == tensor_cores
    assert quant_tiles(5, 6144, 4096, "int4", table=table) == gemv  # the row bucket of 5..8
    for rows, n, k, kind in ((1, 4096, 4096, "int4"), (2, 4096, 4096, "fp8"), (1, 4096, 12288, "fp8"),
                             (8, 6144, 4096, "fp8"), (16, 6144, 4096, "int4")):
        assert quant_tiles(rows, n, k, kind, table=table) == quant_tiles(rows, n, k, kind)
    assert table_for("NVIDIA H100 80GB HBM3") is TABLES["H100"] and table_for("NVIDIA A100-SXM4-80GB") == {}


def test_the_h200_table_serves_its_own_keys_only() -> None:
    """Each entry at every row count of its bucket; a shape it lacks, the rule; int4 at one row on the wide row GEMV;
    a GEMV entry takes its bucket's rows in each program, or one (int4's row GEMV, a row's own programs)."""
    h200 = table_for("NVIDIA H200")
    assert h200 is TABLES["H200"] and table_for("NVIDIA H200 NVL") is h200 and table_for("NVIDIA H100 PCIe") is not h200
    assert all(isinstance(tiles, WideGemvTiles) for key, tiles in h200.items() if key[:2] == ("int4", 1))
    assert any(key[:2] == ("int4", 1) for key in h200)
    for (kind, bucket, n, k), tiles in h200.items():
        assert not isinstance(tiles, GemvTiles) or tiles.rows == bucket or (kind, tiles.rows) == ("int4", 1)
        for rows in range(bucket // 2 + 1, bucket + 1):
            assert quant_tiles(rows, n, k, kind, table=h200) == tiles
        assert quant_tiles(bucket, n + 128, k, kind, table=h200) == quant_tiles(bucket, n + 128, k, kind)



def _ragged_row_case(n: int, k: int, group_size: int, kind: str
                     ) -> tuple[IntGroups, IntWeight, torch.Tensor, torch.Generator]:
    """4-bit weights [n, k] whose last group is cut short at K (the rule, and its kernel form), one float16 row of x,
    and the generator that made them (for what a test draws next)."""
    g = torch.Generator().manual_seed(n * k + group_size)
    num_groups = -(-k // group_size)
    groups = _int_groups(4, group_size, kind, n, num_groups * group_size, g)
    groups.levels = groups.levels[:, :k]
    groups.group_ids = (torch.arange(k) // group_size).to(torch.int32)
    return groups, to_kernel_form(groups, torch.float16), torch.randn(1, k, generator=g).half(), g

@pytest.fixture(scope="module")
def row_gemv() -> ModuleType:
    return interpreted("int4_row_gemv")


@pytest.mark.parametrize(("group_size", "kind", "n", "k", "tiles"), [
    (128, "symmetric", 13, 320, GemvTiles(1, 4, 256, 4)), (128, "zeros", 9, 512, None),
    (128, "zeros", 21, 4096, None), (64, "equal-zeros", 7, 192, GemvTiles(1, 4, 128, 2)),
    (32, "offsets", 6, 160, GemvTiles(1, 2, 64, 1)), (32, "zeros", 5, 1024, GemvTiles(1, 8, 512, 4)),
    (16, "zeros", 5, 256, GemvTiles(1, 8, 128, 4)), (8, "offsets", 3, 96, GemvTiles(1, 2, 64, 1)),
    (512, "symmetric", 4, 320, GemvTiles(1, 4, 128, 1))])
def test_int4_row_gemv_equals_the_dequantized_product(int_kernel: ModuleType, row_gemv: ModuleType, group_size: int,
                                                      kind: str, n: int, k: int, tiles: GemvTiles | None) -> None:
    """One row of x through int_gemm's rule or a row GEMV tile: ragged N, K past the tile and past the last whole
    group (a group of fewer columns), groups from a word (8 columns) to wider than K, zero points per group, one for
    all, offsets (GGUF's), a bias and a column slice of a wider output."""
    groups, stored, x, g = _ragged_row_case(n, k, group_size, kind)
    assert row_gemv.takes_row_gemv(stored, x)
    bias = torch.randn(n, generator=g).half()
    out = torch.zeros(1, n + 8, dtype=torch.float16)
    chosen = None if tiles is None else int_kernel.GemvTiles(**tiles.__dict__)  # None: the wide row GEMV's rule
    int_kernel.int_gemm(x, stored, bias, out=out[:, 4 : 4 + n], tiles=chosen)
    _close(out[:, 4 : 4 + n], x.float() @ groups.dequantize().T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()
    direct = torch.zeros(1, n, dtype=torch.float16)  # the kernel itself (int_gemm might have routed elsewhere)
    row_gemv.int4_row_gemv(x, stored, None, direct, row_gemv.GemvTiles(**(tiles or gemv_tiles(1, k, "int4")).__dict__),
                           False)
    _close(direct, x.float() @ groups.dequantize().T)


@pytest.fixture(scope="module")
def wide_gemv() -> ModuleType:
    return interpreted("int4_wide_gemv")


@pytest.mark.parametrize(("group_size", "kind", "n", "k", "tiles"), [
    (128, "symmetric", 13, 4096, WideGemvTiles(4, 2048, 1, 1, 2)),
    (128, "zeros", 9, 2560, WideGemvTiles(4, 1024, 1, 2, 1)),
    (64, "equal-zeros", 7, 3072, WideGemvTiles(2, 2048, 2, 1, 1, True)),
    (32, "offsets", 6, 160, WideGemvTiles(2, 1024, 1, 1, 0)),
    (16, "zeros", 5, 4096, WideGemvTiles(8, 1024, 1, 4, 3)),
    (8, "offsets", 3, 2048, WideGemvTiles(4, 4096, 1, 1, 1)),
    (512, "symmetric", 4, 1536, WideGemvTiles(4, 1024, 1, 3, 2))])
def test_int4_wide_gemv_equals_the_dequantized_product(int_kernel: ModuleType, group_size: int, kind: str, n: int,
                                                       k: int, tiles: WideGemvTiles) -> None:
    """One row of x through the wide row GEMV's tiles by int_gemm: ragged N, K past the last whole tile and group,
    shorter than a tile, split in slices (the last one short), prefetches past the slice and K, loads in order, two
    warps, groups from a word to wider than a tile, zero points per group, one for all, offsets, a bias and a column
    slice of a wider output."""
    groups, stored, x, g = _ragged_row_case(n, k, group_size, kind)
    bias = torch.randn(n, generator=g).half()
    out = torch.zeros(1, n + 8, dtype=torch.float16)
    int_kernel.int_gemm(x, stored, bias, out=out[:, 4 : 4 + n], tiles=int_kernel.WideGemvTiles(**tiles.__dict__))
    _close(out[:, 4 : 4 + n], x.float() @ groups.dequantize().T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()


def test_wide_gemv_tiles_split_only_what_would_leave_multiprocessors_idle() -> None:
    """The wide row GEMV's rule: 4 rows by whole warps of chunks, a power of two of columns; K split only where the
    programs would give a multiprocessor fewer than WIDE_MIN_WARPS warps, each slice a whole tile at least."""
    for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (5120, 2048), (2048, 4096), (128, 2048),
                 (20, 200)):
        t = wide_gemv_tiles(n, k, 132)
        assert t.block_n == 4 and t.block_k % (1024 * t.num_warps) == 0 and t.block_k & (t.block_k - 1) == 0, t
        programs = -(-n // t.block_n) * t.num_warps
        assert (t.split_k > 1) == (programs < WIDE_MIN_WARPS * 132 and k >= 2 * t.block_k), (n, k, t)
        assert t.split_k == 1 or k // t.split_k >= t.block_k
    assert wide_gemv_tiles(2048, 4096, 132).split_k == 2 and wide_gemv_tiles(4096, 4096, 132).split_k == 1


def test_wide_gemv_tiles_refuse_what_the_kernel_cannot_lay_out() -> None:
    """Tiles of whole warps of 16-byte loads (1,024 columns a warp), powers of two, a slice at least, no negative
    prefetch."""
    for args in ((4, 512, 1, 1, 1), (4, 2048, 4, 1, 1), (3, 2048, 1, 1, 1), (4, 3072, 1, 1, 1), (4, 2048, 1, 0, 1),
                 (4, 2048, 1, 1, -1)):
        with pytest.raises(ValueError):
            WideGemvTiles(*args)
    assert WideGemvTiles(8, 4096, 4, 2, 0).block_k == 4096


def test_wide_tiles_the_row_gemv_does_not_take_go_to_the_tensor_cores(int_kernel: ModuleType) -> None:
    """Act order, two rows: the wide tiles fall back to the tensor-core rule, and the product is the reference's."""
    g = torch.Generator().manual_seed(5)
    tiles = int_kernel.WideGemvTiles(4, 1024, 1, 1, 1)
    act_order = to_kernel_form(_int_groups(4, 64, "act-order", 12, 256, g), torch.float16)
    zeros = to_kernel_form(_int_groups(4, 64, "zeros", 12, 256, g), torch.float16)
    for stored, m in ((act_order, 1), (zeros, 2)):
        x = torch.randn(m, 256, generator=g).half()
        _close(int_kernel.int_gemm(x, stored, tiles=tiles), x.float() @ stored.int_groups().dequantize().T)


ROW_GEMV_X = [(torch.bfloat16, 1.0, None), (torch.bfloat16, 1e-3, None), (torch.bfloat16, 1e-6, None),
              (torch.bfloat16, 1e3, None), (torch.bfloat16, 1.0, 1e5), (torch.bfloat16, 1e-2, 1e30),
              (torch.float16, 1e-5, None), (torch.float16, 1.0, 6e4)]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize(("dtype", "x_scale", "outlier"), ROW_GEMV_X)
def test_int4_row_gemv_holds_x_of_any_magnitude(row_gemv: ModuleType, wide_gemv: ModuleType, dtype: torch.dtype,
                                                x_scale: float, outlier: float | None, wide: bool) -> None:
    """x from bf16's tiny values to past float16's range (1e5, 1e30: outliers as large activations have them), in
    float16 as far as its subnormals, with zero points per group, into float32 outputs: within float16's rounding of
    the exact product relative to the largest output (the kernels' products are float16 pairs, of x scaled a chunk at
    a time by a power of two). The row GEMV and the wide one (one tile wider than K)."""
    g = torch.Generator().manual_seed(int(x_scale * 1000) + 7)
    n, k = 64, 512
    groups = _int_groups(4, 64, "zeros", n, k, g)
    stored = to_kernel_form(groups, dtype)
    x = torch.randn(1, k, generator=g) * x_scale
    if outlier is not None:
        x[0, ::61] = outlier * torch.linspace(-1, 1, x[0, ::61].numel())
    x = x.to(dtype)
    assert row_gemv.takes_row_gemv(stored, x)
    y = torch.zeros(1, n)
    if wide:
        wide_gemv.int4_wide_gemv(x, stored, None, y, wide_gemv.WideGemvTiles(4, 1024, 1, 2, 1), False)
    else:
        row_gemv.int4_row_gemv(x, stored, None, y, row_gemv.GemvTiles(1, 4, 256, 2), False)
    reference = x.double() @ stored.int_groups().dequantize().double().T  # its 16-bit scales
    assert y.isfinite().all()
    assert ((y.double() - reference).abs().max() / reference.abs().max()).item() < 1e-3


@pytest.mark.parametrize(("group_size", "kind", "m", "n", "k"), [
    (32, "offsets", 2, 13, 320), (128, "zeros", 5, 9, 576), (16, "symmetric", 8, 6, 160)])
def test_int4_row_gemv_takes_each_row_of_a_verifying_step(int_kernel: ModuleType, row_gemv: ModuleType,
                                                          group_size: int, kind: str, m: int, n: int, k: int) -> None:
    """Several rows of x (a verifying step's, rows of a wider tensor) through the row GEMV's tiles into a column slice
    of a wider output: every row the reference's, and nothing outside the slice written."""
    groups, stored, _, g = _ragged_row_case(n, k, group_size, kind)
    x = torch.randn(m, k + 6, generator=g).half()[:, 2 : 2 + k]  # a row stride past K
    bias = torch.randn(n, generator=g).half()
    out = torch.zeros(m, n + 8, dtype=torch.float16)
    assert row_gemv.takes_row_gemv(stored, x)
    int_kernel.int_gemm(x, stored, bias, out=out[:, 4 : 4 + n], tiles=int_kernel.GemvTiles(1, 4, 256, 2))
    _close(out[:, 4 : 4 + n], x.float() @ groups.dequantize().T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()


def test_row_gemv_leaves_act_order_and_many_rows_to_the_other_kernels(int_kernel: ModuleType,
                                                                      row_gemv: ModuleType) -> None:
    """Act order (x gathered) and 8-bit levels are not the row GEMV's: int_gemm's rule sends one row of them to the
    tensor cores, and the product is still the reference's; rows past MAX_ROWS, or whose pairs of columns a row
    stride would misalign, never reach it."""
    g = torch.Generator().manual_seed(11)
    for bits, kind in ((4, "act-order"), (8, "zeros")):
        stored = to_kernel_form(_int_groups(bits, 64, kind, 12, 256, g), torch.float16)
        x = torch.randn(1, 256, generator=g).half()
        assert not row_gemv.takes_row_gemv(stored, x)
        _close(int_kernel.int_gemm(x, stored), x.float() @ stored.int_groups().dequantize().T)
    stored = to_kernel_form(_int_groups(4, 64, "zeros", 12, 256, g), torch.float16)
    assert row_gemv.takes_row_gemv(stored, torch.zeros(row_gemv.MAX_ROWS, 256).half())
    assert not row_gemv.takes_row_gemv(stored, torch.zeros(row_gemv.MAX_ROWS + 1, 256).half())
    assert not row_gemv.takes_row_gemv(stored, torch.zeros(2, 257).half()[:, :256])


@pytest.fixture(scope="module")
def fp8_row_gemv() -> ModuleType:
    return interpreted("fp8_row_gemv")


def _fp8_levels(n: int, k: int, block: tuple[int, int], g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 levels [n, k] spanning e4m3's range (subnormals to 448, both signs) and their scales for `block`."""
    levels = (torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-8, 8, (n, k), generator=g).float()))
    levels = levels.clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 1e-3 + 1e-4
    return levels, scales


@pytest.mark.parametrize(("n", "k", "block", "tiles"), [
    (13, 320, (128, 128), GemvTiles(1, 4, 256, 4)), (9, 512, (128, 128), GemvTiles(1, 8, 512, 8)),
    (7, 384, (16, 64), GemvTiles(1, 2, 128, 1)), (6, 96, (1, 96), GemvTiles(1, 4, 64, 1)),
    (5, 1024, (128, 128), GemvTiles(1, 16, 512, 4))])
def test_fp8_row_gemv_equals_the_dequantized_product(fp8_row_gemv: ModuleType, n: int, k: int,
                                                     block: tuple[int, int], tiles: GemvTiles) -> None:
    """One row of float16 x: ragged N, K past the tile, block scales of several shapes and one scale per row, a bias
    and a column slice of a wider output."""
    g = torch.Generator().manual_seed(n * k + block[1])
    levels, scales = _fp8_levels(n, k, block, g)
    x = torch.randn(1, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    is_per_row = block[1] >= k and block[0] == 1
    group = None if is_per_row else block[1]
    assert fp8_row_gemv.takes_fp8_row_gemv(x, levels, group)
    out = torch.zeros(1, n + 8, dtype=torch.float16)
    fp8_row_gemv.fp8_row_gemv(x, levels, scales, block[0], group, bias, out[:, 4 : 4 + n],
                              fp8_row_gemv.GemvTiles(**tiles.__dict__), False)
    _close(out[:, 4 : 4 + n], x.float() @ dequantize_blocks(levels, scales, block).T + bias.float())
    assert not out[:, :4].any() and not out[:, 4 + n :].any()


@pytest.mark.parametrize(("dtype", "x_scale", "outlier"), ROW_GEMV_X)
def test_fp8_row_gemv_holds_x_of_any_magnitude(fp8_row_gemv: ModuleType, dtype: torch.dtype, x_scale: float,
                                               outlier: float | None) -> None:
    """x from bf16's tiny values to past float16's range, in float16 as far as its subnormals, FP8 levels up to 448,
    into float32 outputs: products in float16 pairs (of x scaled a chunk at a time by a power of two) summed in
    float16 through 8 products, so within bf16's rounding of the products' magnitudes."""
    g = torch.Generator().manual_seed(int(x_scale * 1000) + 11)
    n, k, block = 64, 512, (128, 128)
    levels, scales = _fp8_levels(n, k, block, g)
    levels[:, ::7] = torch.full((n, levels[:, ::7].shape[1]), 448.0).to(torch.float8_e4m3fn)  # e4m3's largest
    x = torch.randn(1, k, generator=g) * x_scale
    if outlier is not None:
        x[0, ::61] = outlier * torch.linspace(-1, 1, x[0, ::61].numel())
    x = x.to(dtype)
    y = torch.zeros(1, n)
    fp8_row_gemv.fp8_row_gemv(x, levels, scales, 128, 128, None, y, fp8_row_gemv.GemvTiles(1, 4, 256, 2), False)
    weight = dequantize_blocks(levels, scales, block).double()
    reference, magnitudes = x.double() @ weight.T, x.double().abs() @ weight.abs().T
    assert y.isfinite().all()
    # bf16-like: within half a bf16 rounding (2^-9) of the sum of the products' magnitudes, as bf16 products would be
    assert ((y.double() - reference).abs() <= 2.0**-9 * magnitudes).all(), (y.double() - reference).abs().max()


def test_fp8_tiles_choose_the_row_gemv_or_quant_gemvs(fp8_kernel: ModuleType) -> None:
    """One row on GEMV tiles runs fp8_row_gemv, and on tiles a table entry marks `is_row_gemv=False` quant_gemv.py's
    GEMV (float32 products: other low bits than the packed float16 sums'), each bit for bit as called directly."""
    g = torch.Generator().manual_seed(5)
    levels, scales = _fp8_levels(16, 512, (128, 128), g)
    x = torch.randn(1, 512, generator=g).half()
    results = []
    for is_row_gemv, direct in ((True, fp8_kernel.fp8_row_gemv), (False, fp8_kernel.fp8_gemv)):
        tiles = fp8_kernel.GemvTiles(1, 4, 256, 4, is_row_gemv=is_row_gemv)
        y, expected = torch.zeros(1, 16), torch.zeros(1, 16)
        fp8_kernel.fp8_gemm(x, levels, scales, (128, 128), out=y, tiles=tiles)
        direct(x, levels, scales, 128, 128, None, expected, tiles, False)
        assert torch.equal(y, expected), is_row_gemv
        results.append(y)
    assert not torch.equal(*results)
