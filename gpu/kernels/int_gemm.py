"""Triton kernel: W4A16 / W8A16 GEMM y = x @ W^T (+ bias), integer weights dequantized in registers in the main loop.

x [M, K] bf16/fp16; W in gpu/quant/int_weights.py's `IntWeight` form: levels packed in pairs along K (the two
16-bit halves of a word hold two consecutive columns), a scale and a zero point or offset per group of GROUP columns
in x's dtype, and optionally `perm`, the column of x each stored column multiplies (groups sorted by act order).
Each [BLOCK_N, BLOCK_K] weight tile is dequantized to x's dtype and multiplied on the tensor cores (float32 sums):
a decode step reads the packed bytes, a quarter (int4) or half (int8) of bf16's.

4-bit levels with bf16/fp16 activations become 16-bit floats two at a time: a word's pair, masked and ORed with
the exponent of 128 (bf16) or 1024 (fp16), is two exact 16-bit floats magic + level; no integer-to-float conversion.
Then, at a decode step's few rows with groups of 128 columns or more (`_takes_sums`), those floats go to the tensor
cores as they are, one product per group, and the scale, zero point and magic act on the sums (scale * dot -
scale * (magic + zero) * sum(x), in float32: no weight is rounded); otherwise each weight is dequantized,
(v - (magic + zero)) * scale (+ offset) rounded once to x's dtype, and the tile multiplied. 8-bit levels (and
float32 activations) take the magic in float32 (2^23 + level).

The weight tile is the tensor cores' M side and x's rows their N side (as gpu/kernels/fp8_gemm.py's, with its tile
rule, split-K and reduce); rows past M and N re-read the last valid row, never stored. CUDA-graph capturable.
From INT_CUBLAS_MIN_ROWS rows a 16-bit product dequantizes the weight once instead (`int_dequantized`) and multiplies
on cuBLAS.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.device_tables import device_name
from gpu.kernels.fp8_gemm import num_sms, reduce_split_k
from gpu.kernels.int4_row_gemv import int4_row_gemv, takes_row_gemv
from gpu.kernels.int4_wide_gemv import int4_wide_gemv
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.quant_gemm_configs import (
    INT_CUBLAS_MIN_ROWS,
    GemvTiles,
    QuantTiles,
    Tiles,
    WideGemvTiles,
    quant_tiles,
    runs_row_gemv,
    table_for,
    tensor_core_tiles,
)
from gpu.kernels.quant_gemv import int_gemv, pointer_or
from gpu.kernels.skinny_gemm import _store_tile
from gpu.kernels.triton_math import add

if TYPE_CHECKING:
    from gpu.quant.int_weights import IntWeight

PACKED_DTYPES = (torch.bfloat16, torch.float16)
SUMS_MIN_GROUP = 128  # groups this wide or wider: scales on the sums (a product per group costs less than per weight)
SUMS_MAX_ROWS = 32  # row tiles up to here: scales on the sums


@triton.jit
def _per_group(ptr, rows_offset, k, num_groups, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP: tl.constexpr):
    """A per-group tensor's values at the tile's columns: [BLOCK_N, 1] where one group spans the tile, else
    [BLOCK_N, BLOCK_K] (groups past the last, which multiply x's zeros, read the last)."""
    if GROUP >= BLOCK_K:
        values = tl.load(ptr + rows_offset + tl.minimum(k // GROUP, num_groups - 1))[:, None]
    else:
        ids = tl.minimum(k // GROUP + tl.arange(0, BLOCK_K // GROUP), num_groups - 1)
        per_group = tl.load(ptr + rows_offset[:, None] + ids[None, :])
        values = tl.reshape(tl.broadcast_to(per_group[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)),
                            (BLOCK_N, BLOCK_K))
    return values


@triton.jit
def _pair_halves(words, BITS: tl.constexpr, OR_BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Words [BLOCK_N, BLOCK_K * BITS / 32] -> [BLOCK_N, BLOCK_K] uint16: each level ORed with OR_BITS."""
    shifts = (tl.arange(0, 16 // BITS) * BITS)[None, None, :]
    pairs = ((words[:, :, None] >> shifts) & (((1 << BITS) - 1) * 0x10001)) | (OR_BITS * 0x10001)
    return tl.reshape(tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16)), (BLOCK_N, BLOCK_K))


@triton.jit
def _dequantize(words, s_ptr, z_ptr, o_ptr, rows_offset, k, num_groups, dtype: tl.constexpr, BITS: tl.constexpr,
                GROUP: tl.constexpr, ZERO: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
                PACKED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The weight tile [BLOCK_N, BLOCK_K] in `dtype`: (level - zero) * scale (+ offset)."""
    scales = _per_group(s_ptr, rows_offset, k, num_groups, BLOCK_N, BLOCK_K, GROUP)
    if PACKED:  # 16-bit floats 128 + level (bf16) or 1024 + level (fp16), exact
        magic: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
        magic_bits: tl.constexpr = 0x4300 if dtype == tl.bfloat16 else 0x6400
        v = _pair_halves(words, BITS, magic_bits, BLOCK_N, BLOCK_K).to(dtype, bitcast=True)
        if HAS_ZEROS:
            c = _per_group(z_ptr, rows_offset, k, num_groups, BLOCK_N, BLOCK_K, GROUP) + tl.full((1, 1), magic, dtype)
        else:
            c = tl.full((1, 1), magic + ZERO, dtype)
        w = (v - c) * scales
        if HAS_OFFSETS:
            w = w + _per_group(o_ptr, rows_offset, k, num_groups, BLOCK_N, BLOCK_K, GROUP)
    else:  # float32 2^23 + level, exact
        levels = _pair_halves(words, BITS, 0, BLOCK_N, BLOCK_K).to(tl.int32)
        v = (levels | 0x4B000000).to(tl.float32, bitcast=True)
        if HAS_ZEROS:
            c = _per_group(z_ptr, rows_offset, k, num_groups, BLOCK_N, BLOCK_K, GROUP).to(tl.float32) + 8388608.0
        else:
            c = 8388608.0 + ZERO
        w32 = (v - c) * scales.to(tl.float32)
        if HAS_OFFSETS:
            w32 += _per_group(o_ptr, rows_offset, k, num_groups, BLOCK_N, BLOCK_K, GROUP).to(tl.float32)
        w = w32.to(dtype)
    return w


@triton.jit
def _sums_product(words, x, s_ptr, z_ptr, o_ptr, rows_offset, group, dtype: tl.constexpr, ZERO: tl.constexpr,
                  HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr):
    """sum_k w[n, k] x[m, k] over one group's sub-tile [BLOCK_N, SUB] of 4-bit levels, as [BLOCK_N, BLOCK_M] float32:
    the tensor cores multiply x with the exact 16-bit floats magic + level, and the scale, zero point, offset and
    magic act on the sums: scale * dot - (scale * (magic + zero) - offset) * sum(x)."""
    magic: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
    magic_bits: tl.constexpr = 0x4300 if dtype == tl.bfloat16 else 0x6400
    v = _pair_halves(words, 4, magic_bits, BLOCK_N, SUB).to(dtype, bitcast=True)
    dot = tl.dot(v, tl.trans(x))
    x_sum = tl.reduce(x.to(tl.float32), 1, add)[None, :]  # [1, BLOCK_M]
    scale = tl.load(s_ptr + rows_offset + group).to(tl.float32)[:, None]
    if HAS_ZEROS:
        zero = tl.load(z_ptr + rows_offset + group).to(tl.float32)[:, None]
    else:
        zero = ZERO
    coefficient = scale * (magic + zero)
    if HAS_OFFSETS:
        coefficient -= tl.load(o_ptr + rows_offset + group).to(tl.float32)[:, None]
    return scale * dot - coefficient * x_sum


@triton.jit(do_not_specialize=["M", "N"])
def _int_gemm_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, o_ptr, perm_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split, num_groups,
    stride_xm, stride_qn, stride_gn, stride_os, stride_om,
    BITS: tl.constexpr, GROUP: tl.constexpr, ZERO: tl.constexpr, HAS_ZEROS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr, HAS_PERM: tl.constexpr, PACKED: tl.constexpr, SUMS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_PARTIAL: tl.constexpr, EVEN_K: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pdl_start(USE_PDL)
    PER_WORD: tl.constexpr = 32 // BITS
    # Sub-tiles of one group each where the scales act on the sums; else the whole tile.
    SUB: tl.constexpr = (BLOCK_K if GROUP >= BLOCK_K else GROUP) if SUMS else BLOCK_K
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_sub = tl.arange(0, SUB)
    offs_words = tl.arange(0, SUB // PER_WORD)
    x_rows = x_ptr + tl.minimum(offs_m, M - 1)[:, None] * stride_xm  # [BLOCK_M, 1]
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows_offset = rows_w * stride_gn
    q_rows = q_ptr + rows_w[:, None] * stride_qn  # [BLOCK_N, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.full((BLOCK_N, BLOCK_M), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        for g in tl.static_range(BLOCK_K // SUB):
            sub = k + g * SUB  # the sub-tile's first column
            ks = sub + offs_sub
            columns = tl.load(perm_ptr + tl.minimum(ks, K - 1)) if HAS_PERM else ks
            word_cols = sub // PER_WORD + offs_words
            if EVEN_K:
                x = tl.load(x_rows + columns[None, :])
                words = tl.load(q_rows + word_cols[None, :])
            else:
                x = tl.load(x_rows + columns[None, :], mask=(ks < k_end)[None, :], other=0.0)
                words = tl.load(q_rows + word_cols[None, :], mask=(word_cols * PER_WORD < k_end)[None, :], other=0)
            if SUMS:
                acc += _sums_product(words, x, s_ptr, z_ptr, o_ptr, rows_offset,
                                     tl.minimum(sub // GROUP, num_groups - 1), dtype, ZERO, HAS_ZEROS, HAS_OFFSETS,
                                     BLOCK_N, SUB)
            else:
                w = _dequantize(words, s_ptr, z_ptr, o_ptr, rows_offset, sub, num_groups, dtype, BITS, GROUP, ZERO,
                                HAS_ZEROS, HAS_OFFSETS, PACKED, BLOCK_N, SUB)
                acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
    _store_tile(tl.trans(acc), bias_ptr, out_ptr, offs_m, offs_n, pid_k, M, N, stride_os, stride_om, HAS_BIAS,
                IS_PARTIAL)


def int_gemm(x: torch.Tensor, weight: "IntWeight", bias: torch.Tensor | None = None, use_pdl: bool = True,
             out: torch.Tensor | None = None, tiles: Tiles | None = None
             ) -> torch.Tensor:  # [M, K] x [N, K * bits / 32] -> [M, N]
    """x @ W.T (+ bias) for W in the kernel's form; `out` (an [M, N] view with unit stride along N) receives it.
    `tiles` (else quant_tiles' choice) picks the tensor-core kernel or the GEMV: one row of 4-bit weights that
    gpu/kernels/int4_row_gemv.py takes runs there (or in int4_wide_gemv.py, for its tiles), other rows in
    gpu/kernels/quant_gemv.py. Without `tiles`, 16-bit x of INT_CUBLAS_MIN_ROWS rows or more multiplies the weight
    dequantized on cuBLAS."""
    m, k = x.shape
    words, scales = weight.weight, weight.scales
    n = words.shape[0]
    if words.dtype != torch.int32 or words.shape[1] * 32 // weight.bits != k or x.stride(1) != 1:
        raise ValueError(f"x [M, K] and int32 [N, K * {weight.bits} / 32] expected, got {tuple(x.shape)} and "
                         f"{words.dtype} {tuple(words.shape)}")
    if scales.shape[0] != n or scales.dtype != x.dtype or any(
            t is not None and (t.shape != scales.shape or t.dtype != scales.dtype)
            for t in (weight.zeros, weight.offsets)):
        raise ValueError(f"scales {tuple(scales.shape)} {scales.dtype} (and zeros, offsets) must be [{n}, groups] "
                         f"in x's dtype {x.dtype}")
    if out is not None and (out.shape != (m, n) or out.stride(1) != 1):
        raise ValueError(f"out must be [{m}, {n}] with unit stride along N, got {tuple(out.shape)} {out.stride()}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0:
        return y
    if tiles is None and m >= INT_CUBLAS_MIN_ROWS and x.dtype in PACKED_DTYPES:
        w = int_dequantized(weight, x.dtype, use_pdl)
        return torch.mm(x, w.T, out=y) if bias is None else torch.addmm(bias, x, w.T, out=y)
    t = tiles or _chosen_tiles(x, weight)
    if isinstance(t, WideGemvTiles) and not (m == 1 and takes_row_gemv(weight, x)):  # act order, narrow groups, rows
        t = tensor_core_tiles(m, n, k, f"int{weight.bits}", num_sms(x.device))
    if isinstance(t, WideGemvTiles):
        int4_wide_gemv(x, weight, bias, y, t, uses_pdl(use_pdl, x))
        return y
    if isinstance(t, GemvTiles):
        gemv = int4_row_gemv if runs_row_gemv(t) and takes_row_gemv(weight, x) else int_gemv
        gemv(x, weight, bias, y, t, uses_pdl(use_pdl, x))
        return y
    k_per_split = triton.cdiv(triton.cdiv(k, t.split_k), t.block_k) * t.block_k
    split = triton.cdiv(k, k_per_split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else y
    pdl = uses_pdl(use_pdl, x)
    is_half = x.dtype in PACKED_DTYPES  # 16-bit activations: levels as exact 16-bit floats
    _int_gemm_kernel[(triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), split)](
        x, words, scales, pointer_or(weight.zeros, scales), pointer_or(weight.offsets, scales),
        pointer_or(weight.perm, words), pointer_or(bias, scales), part, m, n, k, k_per_split, scales.shape[1],
        x.stride(0), words.stride(0), scales.stride(0), part.stride(0) if split > 1 else 0, part.stride(-2),
        BITS=weight.bits, GROUP=weight.group, ZERO=weight.zero, HAS_ZEROS=weight.zeros is not None,
        HAS_OFFSETS=weight.offsets is not None, HAS_PERM=weight.perm is not None,
        PACKED=weight.bits == 4 and is_half, SUMS=_takes_sums(weight, is_half, t),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", HAS_BIAS=bias is not None,
        IS_PARTIAL=split > 1, EVEN_K=k % k_per_split == 0, USE_PDL=pdl, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        num_warps=t.num_warps, num_stages=t.num_stages, launch_pdl=pdl)
    if split > 1:
        reduce_split_k(part, bias, y, pdl)
    return y


@triton.jit
def _int_dequantize_kernel(
    q_ptr, s_ptr, z_ptr, o_ptr, perm_ptr, out_ptr, N, K, num_groups, stride_qn, stride_gn, stride_on,
    BITS: tl.constexpr, GROUP: tl.constexpr, ZERO: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
    HAS_PERM: tl.constexpr, USE_PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One [BLOCK_N, BLOCK_K] tile of W in out's dtype, each weight computed in float32 and rounded once, stored at its
    columns of x (through `perm` where the stored columns are sorted by group)."""
    pdl_start(USE_PDL)
    PER_WORD: tl.constexpr = 32 // BITS
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1) * BLOCK_K
    ks = k + tl.arange(0, BLOCK_K)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    word_cols = k // PER_WORD + tl.arange(0, BLOCK_K // PER_WORD)
    words = tl.load(q_ptr + rows_w[:, None] * stride_qn + word_cols[None, :],
                    mask=(word_cols * PER_WORD < K)[None, :], other=0)
    w = _dequantize(words, s_ptr, z_ptr, o_ptr, rows_w * stride_gn, k, num_groups, out_ptr.dtype.element_ty, BITS,
                    GROUP, ZERO, HAS_ZEROS, HAS_OFFSETS, False, BLOCK_N, BLOCK_K)
    columns = tl.load(perm_ptr + tl.minimum(ks, K - 1)) if HAS_PERM else ks
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * stride_on + columns[None, :], w,
             mask=(offs_n < N)[:, None] & (ks < K)[None, :])


def int_dequantized(weight: "IntWeight", dtype: torch.dtype, use_pdl: bool = True) -> torch.Tensor:
    """W [N, K] in `dtype` (16-bit), in x's column order, each weight rounded once (the reference's rounding)."""
    words, scales = weight.weight, weight.scales
    n, k = words.shape[0], words.shape[1] * 32 // weight.bits
    out = torch.empty((n, k), dtype=dtype, device=words.device)
    block_n, block_k = 64, 128
    pdl = uses_pdl(use_pdl, words)
    _int_dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        words, scales, pointer_or(weight.zeros, scales), pointer_or(weight.offsets, scales),
        pointer_or(weight.perm, words), out, n, k, scales.shape[1], words.stride(0), scales.stride(0), out.stride(0),
        BITS=weight.bits, GROUP=weight.group, ZERO=weight.zero, HAS_ZEROS=weight.zeros is not None,
        HAS_OFFSETS=weight.offsets is not None, HAS_PERM=weight.perm is not None,
        USE_PDL=pdl, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, launch_pdl=pdl)
    return out


def _chosen_tiles(x: torch.Tensor, weight: "IntWeight") -> Tiles:
    """quant_tiles' choice; where it sends one row of 4-bit weights to the row GEMV and that kernel does not take
    them (act order, groups narrower than a word), the tensor cores: the row GEMV's tiles are no GEMV tiles for
    gpu/kernels/quant_gemv.py."""
    (m, k), n, kind = x.shape, weight.weight.shape[0], f"int{weight.bits}"
    t = quant_tiles(m, n, k, kind, num_sms(x.device), table_for(device_name(x.device)))
    if runs_row_gemv(t) and kind == "int4" and not takes_row_gemv(weight, x):
        return tensor_core_tiles(m, n, k, kind, num_sms(x.device))
    return t


def _takes_sums(weight: "IntWeight", is_half: bool, tiles: QuantTiles) -> bool:
    """Whether the scales act on the sums (_sums_product): 4-bit levels, 16-bit activations, groups of SUMS_MIN_GROUP
    columns or more in the stored order, and a decode step's few rows. Elsewhere a weight's own dequantization costs
    less: many rows' accumulators, act order's gathered x (its sums cross the threads), or 8-bit levels (twice the
    nibbles: the registers spill)."""
    return (weight.bits == 4 and is_half and weight.group >= SUMS_MIN_GROUP and weight.perm is None
            and tiles.block_m <= SUMS_MAX_ROWS)

