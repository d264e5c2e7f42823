"""Triton kernels: quantized weights times a few rows of x as GEMVs, the weight tile dequantized in registers.

The few-row form of gpu/kernels/fp8_gemm.py and int_gemm.py (their wrappers check the arguments and launch these
where gpu/kernels/quant_gemm_configs.py's `quant_tiles` gives `GemvTiles`): one program per (block of BLOCK_N
output columns, tile of ROWS rows of x) streams its weight rows along the whole of K in [BLOCK_N, BLOCK_K] tiles,
dequantizes each tile to float32 by the format's rule (FP8 levels times their block's scale; integer
levels (level - zero) * scale (+ offset), the levels made exact floats by the 2^23 exponent trick) and adds its
products with every row elementwise into float32 sums, reduced across K once at the end (gpu/kernels/moe_decode.py's
GEMV idiom: no tensor cores, so no row padding to 16, and no split-K or reduce kernel: narrow column blocks make
programs enough to keep the weight stream full). Integer tiles add each word's products up first, in the thread
that holds the word, so that a thread keeps a sum per word rather than per level: tiles that span all of a small K
at several rows then fit in registers, one pass of loads reading the whole weight row. Activations stay in x's
dtype: the product is the reference dequantization times x up to float32 summation order (an FP8 checkpoint's
static activation scale plays no part, as in weight-only FP8 kernels).

Tiles are 4-d, [ROWS, BLOCK_N, BLOCK_K / SUB, SUB] with SUB the columns one scale spans within a tile, so a group's
scale multiplies its sub-tile by broadcasting (no reshape of the weight stream); integer tiles split SUB into
[words, levels of a word]. x's tile is loaded broadcast in the weight tile's layout, each thread reading the columns
its weights multiply (8 bf16, 16 bytes, a load): an FP8 load at several rows is 8 levels wide to match, an int word
is a thread's own; so no tile crosses threads through shared memory in the loop. The next weight tile is loaded
before the current one is used, and the first before waiting on the kernel that writes x (programmatic dependent
launch, gpu/kernels/pdl.py): weights never depend on it. Rows past M and columns past N re-read the last valid one,
never stored. Nothing depends on the data: CUDA-graph capturable.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.quant_gemm_configs import GemvTiles
from gpu.kernels.triton_math import add

if TYPE_CHECKING:
    from gpu.quant.int_weights import IntWeight

MAGIC = tl.constexpr(8388608.0)  # 2^23: a float32 whose low mantissa bits are an integer level reads 2^23 + level


@triton.jit
def _columns(k, G: tl.constexpr, SUB: tl.constexpr):
    """The tile's columns from k, [1, 1, G, SUB]."""
    return (k + tl.arange(0, G)[:, None] * SUB + tl.arange(0, SUB)[None, :])[None, None, :, :]


@triton.jit
def _group_values(ptr, rows_offset, k, num_groups, GROUP: tl.constexpr, G: tl.constexpr, SUB: tl.constexpr):
    """A per-group tensor's values [1, BLOCK_N, G, 1] at the sub-tiles from k (groups past the last read it)."""
    ids = tl.minimum((k + tl.arange(0, G) * SUB) // GROUP, num_groups - 1)
    return tl.load(ptr + rows_offset[None, :, None, None] + ids[None, None, :, None]).to(tl.float32)


@triton.jit
def _x_tile(x_rows, columns, in_k, like, EVEN_K: tl.constexpr):
    """x at `columns` [1, 1, ...] of its rows (`x_rows`, [ROWS, 1, ...] pointers) in float32, broadcast to the shape
    and layout of the weight tile `like` (from L1: no exchange between threads); 0 where `in_k` is false."""
    ptrs, _ = tl.broadcast(x_rows + columns, like)
    if EVEN_K:
        return tl.load(ptrs).to(tl.float32)
    return tl.load(ptrs, mask=in_k, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(y, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, HAS_BIAS: tl.constexpr):
    """y [ROWS, BLOCK_N] float32 (+ bias, in float32) rounded once into the output's valid rows and columns."""
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _reduced(sums):
    """Elementwise sums [ROWS, BLOCK_N, G, SUB] -> [ROWS, BLOCK_N], reduced across K once."""
    return tl.reduce(tl.reduce(sums, 3, add), 2, add)


@triton.jit(do_not_specialize=["M", "N"])
def _fp8_gemv_kernel(
    x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, M, N, K, num_scale_cols, stride_xm, stride_wn, stride_wsn, stride_om,
    SCALE_ROWS: tl.constexpr, GROUP: tl.constexpr, BLOCK_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, USE_PDL: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    SUB: tl.constexpr = GROUP if BLOCK_SCALES and GROUP < BLOCK_K else BLOCK_K
    G: tl.constexpr = BLOCK_K // SUB
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1)
    scale_rows = (rows_w // SCALE_ROWS) * stride_wsn
    w_rows = w_ptr + rows_w[None, :, None, None] * stride_wn
    x_rows = x_ptr + rows_x[:, None, None, None] * stride_xm
    columns = _columns(0, G, SUB)
    if ROWS > 1:  # 8 columns a load, as x's (bf16) take: x's tile and the weight tile then share a layout
        columns = tl.max_contiguous(columns, [1, 1, 1, 8])
    w = tl.load(w_rows + columns, mask=columns < K, other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    sums = tl.full((ROWS, BLOCK_N, G, SUB), 0.0, tl.float32)
    for k in range(0, K, BLOCK_K):
        x = _x_tile(x_rows, columns, columns < K, w, EVEN_K)
        w_next = tl.load(w_rows + columns + BLOCK_K, mask=columns + BLOCK_K < K, other=0.0)
        weight = w.to(tl.float32)
        if BLOCK_SCALES:
            weight *= _group_values(ws_ptr, scale_rows, k, num_scale_cols, GROUP, G, SUB)
        sums += weight * x
        w = w_next
        columns += BLOCK_K
    y = _reduced(sums)
    if not BLOCK_SCALES:  # a scale per row: on the sums
        y *= tl.load(ws_ptr + scale_rows).to(tl.float32)[None, :]
    _store_rows(y, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, HAS_BIAS)


@triton.jit
def _levels(words, BITS: tl.constexpr):
    """Packed words [1, BLOCK_N, G, W, 1] (gpu/quant/int_weights.py's pairs: column 2j + h of a word at bit
    BITS * j + 16 * h) -> [1, BLOCK_N, G, W, 32 / BITS] float32 2^23 + level, a word's columns in order along the
    last axis (no reshape: each thread expands its own words)."""
    c = tl.arange(0, 32 // BITS)
    shifts = (c // 2) * BITS + (c % 2) * 16
    levels = (words >> shifts[None, None, None, None, :]) & ((1 << BITS) - 1)
    return (levels | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _word_columns(k, G: tl.constexpr, W: tl.constexpr, PER_WORD: tl.constexpr):
    """The columns of a tile of G groups of W words from k, [1, 1, G, W, PER_WORD]."""
    words = _columns(k // PER_WORD, G, W)[:, :, :, :, None]
    return words * PER_WORD + tl.arange(0, PER_WORD)[None, None, None, None, :]


@triton.jit
def _x_columns(perm_ptr, stored, K, HAS_PERM: tl.constexpr):
    """x's column for each stored column (act order gathers them)."""
    return tl.load(perm_ptr + tl.minimum(stored, K - 1)) if HAS_PERM else stored


@triton.jit
def _tile_groups(z_ptr, s_ptr, o_ptr, group_rows, k, num_groups, GROUP: tl.constexpr, ZERO: tl.constexpr,
                 HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr, G: tl.constexpr, SUB: tl.constexpr):
    """The tile from k's magic + zero point, scales and offsets (the scales again without offsets), each
    [1, BLOCK_N, G, 1, 1] (a constant zero point: a scalar)."""
    scale = _group_values(s_ptr, group_rows, k, num_groups, GROUP, G, SUB)[:, :, :, :, None]
    if HAS_ZEROS:
        c = _group_values(z_ptr, group_rows, k, num_groups, GROUP, G, SUB)[:, :, :, :, None] + MAGIC
    else:
        c = MAGIC + ZERO
    if HAS_OFFSETS:
        return c, scale, _group_values(o_ptr, group_rows, k, num_groups, GROUP, G, SUB)[:, :, :, :, None]
    return c, scale, scale


@triton.jit(do_not_specialize=["M", "N"])
def _int_gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, o_ptr, perm_ptr, bias_ptr, out_ptr, M, N, K, num_words, num_groups,
    stride_xm, stride_qn, stride_gn, stride_om,
    BITS: tl.constexpr, GROUP: tl.constexpr, ZERO: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
    HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, USE_PDL: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
):
    # Tiles [ROWS, BLOCK_N, G groups, W words, PER_WORD levels].
    PER_WORD: tl.constexpr = 32 // BITS
    SUB: tl.constexpr = GROUP if GROUP < BLOCK_K else BLOCK_K
    G: tl.constexpr = BLOCK_K // SUB
    W: tl.constexpr = SUB // PER_WORD
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    group_rows = rows_w * stride_gn
    q_rows = q_ptr + rows_w[None, :, None, None, None] * stride_qn
    x_rows = x_ptr + tl.minimum(offs_m, M - 1)[:, None, None, None, None] * stride_xm
    # [1, 1, G, W, 1], one word a thread (a load each): the layout x's tile takes, PER_WORD columns a thread
    word_ids = tl.max_contiguous(_columns(0, G, W)[:, :, :, :, None], [1, 1, 1, 1, 1])
    words = tl.load(q_rows + word_ids, mask=word_ids < num_words, other=0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    sums = tl.full((ROWS, BLOCK_N, G, W), 0.0, tl.float32)
    stored = _word_columns(0, G, W, PER_WORD)  # the tile's stored columns
    if AHEAD:  # the first tile's x and group values before the loop, each next one's while this one is used
        x = _x_tile(x_rows, _x_columns(perm_ptr, stored, K, HAS_PERM), stored < K, _levels(words, BITS), False)
        c, scale, offset = _tile_groups(z_ptr, s_ptr, o_ptr, group_rows, 0, num_groups, GROUP, ZERO, HAS_ZEROS,
                                        HAS_OFFSETS, G, SUB)
    for k in range(0, K, BLOCK_K):
        levels = _levels(words, BITS)
        if AHEAD:
            tile_x, tile_c, tile_scale, tile_offset = x, c, scale, offset
            stored += BLOCK_K
            x = _x_tile(x_rows, _x_columns(perm_ptr, stored, K, HAS_PERM), stored < K, levels, False)  # masked: past K
            c, scale, offset = _tile_groups(z_ptr, s_ptr, o_ptr, group_rows, k + BLOCK_K, num_groups, GROUP, ZERO,
                                            HAS_ZEROS, HAS_OFFSETS, G, SUB)
            word_ids += BLOCK_K // PER_WORD
            words = tl.load(q_rows + word_ids, mask=word_ids < num_words, other=0)
        else:  # x, the next weight tile, then the group values, each as late as it can be
            tile_x = _x_tile(x_rows, _x_columns(perm_ptr, stored, K, HAS_PERM), stored < K, levels, EVEN_K)
            stored += BLOCK_K
            word_ids += BLOCK_K // PER_WORD
            words = tl.load(q_rows + word_ids, mask=word_ids < num_words, other=0)
            tile_c, tile_scale, tile_offset = _tile_groups(z_ptr, s_ptr, o_ptr, group_rows, k, num_groups, GROUP,
                                                           ZERO, HAS_ZEROS, HAS_OFFSETS, G, SUB)
        weight = (levels - tile_c) * tile_scale
        if HAS_OFFSETS:
            weight += tile_offset
        sums += tl.reduce(weight * tile_x, 4, add)  # a word's levels, all in its thread: no exchange
    _store_rows(_reduced(sums), bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, HAS_BIAS)


def _grid(m: int, n: int, t: GemvTiles) -> tuple[int, int]:
    return triton.cdiv(n, t.block_n), triton.cdiv(m, t.rows)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor, scale_rows: int, group: int | None,
             bias: torch.Tensor | None, y: torch.Tensor, t: GemvTiles, pdl: bool) -> None:
    """y = x @ dequantized(weight).T (+ bias) for arguments gpu/kernels/fp8_gemm.py checked: block scales of
    (scale_rows, group), or a scale per row (group None)."""
    (m, k), n = x.shape, weight.shape[0]
    _fp8_gemv_kernel[_grid(m, n, t)](
        x, weight, weight_scales, bias if bias is not None else weight_scales, y, m, n, k, weight_scales.shape[1],
        x.stride(0), weight.stride(0), weight_scales.stride(0), y.stride(0),
        SCALE_ROWS=scale_rows, GROUP=group or t.block_k, BLOCK_SCALES=group is not None, HAS_BIAS=bias is not None,
        EVEN_K=k % t.block_k == 0, USE_PDL=pdl, ROWS=t.rows, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        num_warps=t.num_warps, num_stages=1, launch_pdl=pdl)


def int_gemv(x: torch.Tensor, weight: "IntWeight", bias: torch.Tensor | None, y: torch.Tensor, t: GemvTiles,
             pdl: bool) -> None:
    """y = x @ W.T (+ bias) for arguments gpu/kernels/int_gemm.py checked."""
    (m, k), n = x.shape, weight.weight.shape[0]
    scales = weight.scales
    _int_gemv_kernel[_grid(m, n, t)](
        x, weight.weight, scales, pointer_or(weight.zeros, scales), pointer_or(weight.offsets, scales),
        pointer_or(weight.perm, scales), pointer_or(bias, scales), y, m, n, k, weight.weight.shape[1], scales.shape[1],
        x.stride(0), weight.weight.stride(0), scales.stride(0), y.stride(0), BITS=weight.bits, GROUP=weight.group,
        ZERO=weight.zero, HAS_ZEROS=weight.zeros is not None, HAS_OFFSETS=weight.offsets is not None,
        HAS_PERM=weight.perm is not None, HAS_BIAS=bias is not None, EVEN_K=k % t.block_k == 0, USE_PDL=pdl,
        ROWS=t.rows, BLOCK_N=t.block_n, BLOCK_K=t.block_k, AHEAD=t.ahead, num_warps=t.num_warps, num_stages=1,
        launch_pdl=pdl)


def pointer_or(t: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """A pointer argument the kernel never reads where `t` is absent."""
    return t if t is not None else stand_in
