"""Triton kernel: one row of x times 4-bit weights (W4A16: GPTQ, AWQ, compressed-tensors' pack-quantized, GGUF's
4-bit blocks, all in gpu/quant/int_weights.py's `IntWeight` form) as a GEMV, the row a decode step of one sequence
multiplies; a verifying step's few rows each in programs of their own.

The weights stay in their stored layout (int32 [N, K / 8], a word's 8 columns in pairs in its two 16-bit halves).
Each thread reads 16 bytes of a weight row at a time (4 words, 32 consecutive columns: a 128-bit load) for each of
its rows, and once the 32 columns of x they multiply (four 16-byte loads of pairs of columns, made float16 pairs once
for all its rows). Tiles are [4 words, BLOCK_N rows, C chunks of 32 columns], the 4 words of a chunk on the leading
axis so that a thread's words and x's [4, 1, C, 4] pairs fall to the same thread (no tile crosses threads in the
loop: no shared memory, no barrier).

The arithmetic is packed float16, two columns an instruction (gpu/kernels/f16x2.py), since one float32 multiply-add
per weight after unpacking it would issue more instructions than the memory delivers weights: a word's 8 levels
become 4 pairs of (level - z) / 256 in 1 shift, 4 masks into 1024's bits and 4 multiply-adds (exact for integer zero
points z), then 4 packed multiply-adds with x's pairs add them into a float16 pair of sums through the chunk's 4
words. Once a chunk, the pair's two sums become float32 and the chunk's scale s multiplies them into float32 sums
(each word's, for groups narrower than a chunk); with offsets o, o sum_k x_k joins them. Float16 cannot hold every
x (a bf16 x past 65504, or one whose products fall below float16's normal range), so each chunk of x is first
multiplied by the power of two that brings its largest magnitude into [2^14, 2^15), exactly, and the chunk's float32
sums by its inverse: a chunk's values down to 2^-28 of its largest stay exact in float16, its products are normal
down to 2^-20 of it, and with the 1 / 256 its sums stay below 2^15. The products round to float16 (a relative
2^-11, below the bf16 output's rounding), their sums over the chunk too. The rows reduce across threads
once, after the loop. No split-K: narrow column blocks make programs enough.

The next weight tile is loaded before the current one is used, and the first before waiting on the kernel that
writes x (programmatic dependent launch, gpu/kernels/pdl.py): weights never depend on it. Rows past N re-read the
last valid one, never stored. Nothing depends on the data: CUDA-graph capturable.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.f16x2 import (
    abs_max_x2,
    f16x2_fma,
    f16x2_of_bf16x2,
    f16x2_splat,
    f16x2_sum,
    mul_x2,
    nibbles_less_zero,
    words_apart,
)
from gpu.kernels.quant_gemm_configs import GemvTiles
from gpu.kernels.quant_gemv import pointer_or
from gpu.kernels.triton_math import add

if TYPE_CHECKING:
    from gpu.quant.int_weights import IntWeight

CHUNK = 32  # columns a thread's 16-byte load holds
MIN_GROUP = 8  # a group spans whole words: narrower groups take gpu/kernels/quant_gemv.py
MAX_ROWS = 8  # rows of x it takes, a verifying step's few: more share each weight tile on the tensor cores
LEVEL_SCALE: tl.constexpr = tl.constexpr(256.0)  # levels less their zero point are divided by it in float16


@triton.jit
def _group_values(ptr, rows_offset, chunk_cols, num_groups, GROUP: tl.constexpr):
    """A per-group tensor's values in float32, [1, BLOCK_N, C] a chunk (groups of a chunk or wider), else
    [4, BLOCK_N, C] a word (groups past the last, which multiply x's zeros, read the last)."""
    if GROUP >= 32:
        cols = chunk_cols
    else:
        cols = chunk_cols + tl.arange(0, 4)[:, None, None] * 8
    ids = (cols.to(tl.uint32) // GROUP).to(tl.int32)  # columns are never negative: a shift
    return tl.load(ptr + rows_offset + tl.minimum(ids, num_groups - 1)).to(tl.float32)


@triton.jit
def _pairs_of_x(x_pairs, C: tl.constexpr):
    """x_pairs [4, 1, C, 4] (word, pair) split into its pairs, [4, 1, C] each: pair j is columns 2j, 2j + 1 of a
    word, a split within each thread's registers."""
    x_low, x_high = tl.split(x_pairs.reshape(4, 1, C, 2, 2))  # [4, 1, C, 2]: pairs 0 and 2, pairs 1 and 3
    x_0, x_2 = tl.split(x_low)
    x_1, x_3 = tl.split(x_high)
    return x_0, x_1, x_2, x_3


@triton.jit
def _chunk_powers_of_two(x_pairs, C: tl.constexpr, IS_BF16: tl.constexpr):
    """For each chunk of x_pairs [4, 1, C, 4] (16-bit float pairs, bfloat16 where IS_BF16), 2^(14 - e) in both
    halves of a pair of x's type and 2^(e - 14) in float32, [1, 1, C] each, e the exponent of the chunk's largest
    magnitude: the first brings that magnitude into [2^14, 2^15) exactly, the second undoes it. Chunks of values
    too small for a power of two of x's type to reach that range are scaled by the largest it has (or, in bfloat16,
    the largest whose inverse is a normal float32)."""
    x_0, x_1, x_2, x_3 = _pairs_of_x(x_pairs, C)
    by_word = abs_max_x2(abs_max_x2(x_0, x_1, IS_BF16), abs_max_x2(x_2, x_3, IS_BF16), IS_BF16)  # [4, 1, C]
    word_0, word_1, word_2, word_3 = words_apart(by_word, 1, C)
    largest = abs_max_x2(abs_max_x2(word_0, word_1, IS_BF16), abs_max_x2(word_2, word_3, IS_BF16), IS_BF16)
    SHIFT: tl.constexpr = 7 if IS_BF16 else 10  # the exponent's lowest bit in a half
    BIAS: tl.constexpr = 127 if IS_BF16 else 15
    MASK: tl.constexpr = 2 * BIAS + 1
    exponent = tl.maximum((largest >> SHIFT) & MASK, (largest >> (SHIFT + 16)) & MASK)  # biased, [1, C]
    exponent = tl.maximum(exponent, max(BIAS - 96, 14))  # 2^(14 - e) below x's largest, 2^(e - 14) normal
    scale = (2 * BIAS + 14 - exponent) * ((1 << SHIFT) | (1 << (SHIFT + 16)))  # its exponent field in both halves
    inverse = ((exponent - BIAS - 14 + 127) << 23).to(tl.float32, bitcast=True)
    return scale.reshape(1, 1, C), inverse.reshape(1, 1, C)


@triton.jit
def _f16_x(x_pairs, C: tl.constexpr, IS_BF16: tl.constexpr):
    """x_pairs [4, 1, C, 4] as float16 pairs, each chunk scaled by a power of two that brings its largest magnitude
    into [2^14, 2^15) (exact, whatever x's type and magnitude: float16 holds a chunk's values down to 2^-28 of its
    largest exactly), and the powers that undo it, float32 [1, 1, C]."""
    scale, inverse = _chunk_powers_of_two(x_pairs, C, IS_BF16)
    x_pairs = mul_x2(x_pairs, scale.reshape(1, 1, C, 1), IS_BF16)
    if IS_BF16:
        x_pairs = f16x2_of_bf16x2(x_pairs)
    return x_pairs, inverse


@triton.jit
def _word_dots(words, x_pairs, zero_low, zero_high, C: tl.constexpr):
    """sum over each word's 8 columns of (level - zero) / 256 * x, a float16 sum per half of a pair, [4, BLOCK_N, C]:
    one packed multiply-add (two products) per pair of columns."""
    x_0, x_1, x_2, x_3 = _pairs_of_x(x_pairs, C)
    pair_0, pair_1, pair_2, pair_3 = nibbles_less_zero(words, zero_low, zero_high)
    dots = f16x2_fma(pair_0, x_0, tl.full(pair_0.shape, 0, tl.int32))
    return f16x2_fma(pair_3, x_3, f16x2_fma(pair_2, x_2, f16x2_fma(pair_1, x_1, dots)))


@triton.jit
def _add_word_products(dots, pairs, x, A: tl.constexpr, C: tl.constexpr):
    """dots [A, C] + the 4 words' products of pairs [4, A, C] and x [4, 1, C], one multiply-add chain."""
    pair_0, pair_1, pair_2, pair_3 = words_apart(pairs, A, C)
    x_0, x_1, x_2, x_3 = words_apart(x, 1, C)
    return f16x2_fma(pair_3, x_3, f16x2_fma(pair_2, x_2, f16x2_fma(pair_1, x_1, f16x2_fma(pair_0, x_0, dots))))


@triton.jit
def _chunk_dots(words, x_pairs, zero_low, zero_high, BLOCK_N: tl.constexpr, C: tl.constexpr):
    """sum over each chunk's 32 columns of (level - zero) / 256 * x, a float16 sum per half of a pair, [1, BLOCK_N,
    C]: _word_dots' multiply-adds in one chain through the chunk's 4 words."""
    x_0, x_1, x_2, x_3 = _pairs_of_x(x_pairs, C)
    pair_0, pair_1, pair_2, pair_3 = nibbles_less_zero(words, zero_low, zero_high)
    dots = tl.full((BLOCK_N, C), 0, tl.int32)
    dots = _add_word_products(dots, pair_0, x_0, BLOCK_N, C)
    dots = _add_word_products(dots, pair_1, x_1, BLOCK_N, C)
    dots = _add_word_products(dots, pair_2, x_2, BLOCK_N, C)
    dots = _add_word_products(dots, pair_3, x_3, BLOCK_N, C)
    return dots.reshape(1, BLOCK_N, C)


@triton.jit
def _zero_constants(z_ptr, rows_offset, chunk_cols, num_groups, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
                    ZERO_LOW: tl.constexpr, ZERO_HIGH: tl.constexpr):
    """-(1024 + zero) / 256 and -(64 + zero) / 256 in both halves of a float16 pair: nibbles_less_zero's."""
    if HAS_ZEROS:
        zero_low = f16x2_splat(-4.0 - _group_values(z_ptr, rows_offset, chunk_cols, num_groups, GROUP) / LEVEL_SCALE)
        ones, low_to_high = tl.full((1, 1, 1), 0x3C003C00, tl.int32), tl.full((1, 1, 1), 0x43804380, tl.int32)
        return zero_low, f16x2_fma(zero_low, ones, low_to_high)  # + 3.75, exactly: one packed instruction
    else:
        return tl.full((1, 1, 1), ZERO_LOW, tl.int32), tl.full((1, 1, 1), ZERO_HIGH, tl.int32)


@triton.jit
def weight_rows(q_ptr, N, stride_qn, stride_gn, BLOCK_N: tl.constexpr):
    """The program's output columns [BLOCK_N], the offsets of their rows in the per-group tensors and the pointers to
    their weight words, [1, BLOCK_N, 1] each (rows past N re-read the last valid one)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)[None, :, None]
    return offs_n, rows_w * stride_gn, q_ptr + rows_w * stride_qn


@triton.jit
def tile_ids(C: tl.constexpr):
    """A tile's words from its first, [4, 1, C] (word w of chunk c: 4 consecutive words a thread, one 16-byte load),
    and x's pairs of columns from its first, [4, 1, C, 4] (the 32 columns of those words, in the same threads)."""
    word_ids = tl.arange(0, C)[None, None, :] * 4 + tl.arange(0, 4)[:, None, None]
    word_ids = tl.max_contiguous(tl.multiple_of(word_ids, [4, 1, 1]), [4, 1, 1])
    return word_ids, word_ids[:, :, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]


@triton.jit
def tile_sums(words, x_pairs, k, s_ptr, z_ptr, o_ptr, rows_offset, num_groups, GROUP: tl.constexpr,
              ZERO_LOW: tl.constexpr, ZERO_HIGH: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
              X_IS_BF16: tl.constexpr, BLOCK_N: tl.constexpr, C: tl.constexpr):
    """A tile's float32 sums of (level - zero) * scale (+ offset) * x / 256 over each chunk (each word, for groups
    narrower than a chunk): [1 or 4, BLOCK_N, C], of its words [4, BLOCK_N, C] (int32) and x_pairs [4, 1, C, 4]
    (pairs of 16-bit floats, bfloat16 where X_IS_BF16, as loaded) from column k on."""
    BY_WORD: tl.constexpr = GROUP < 32  # a scale per word, else per chunk
    x_pairs, inverse = _f16_x(x_pairs, C, X_IS_BF16)  # [4, 1, C, 4] float16 pairs, [1, 1, C]
    chunk_cols = k + tl.arange(0, C)[None, None, :] * 32
    zero_low, zero_high = _zero_constants(z_ptr, rows_offset, chunk_cols, num_groups, GROUP, HAS_ZEROS, ZERO_LOW,
                                          ZERO_HIGH)
    if BY_WORD:
        dots = _word_dots(words, x_pairs, zero_low, zero_high, C)  # [4, BLOCK_N, C] pairs
    else:
        dots = _chunk_dots(words, x_pairs, zero_low, zero_high, BLOCK_N, C)  # [1, BLOCK_N, C] pairs
    scales = _group_values(s_ptr, rows_offset, chunk_cols, num_groups, GROUP)
    sums = (scales * inverse) * f16x2_sum(dots)
    if HAS_OFFSETS:
        x_sums = tl.reduce(f16x2_sum(x_pairs), 3, add)  # [4, 1, C]
        if not BY_WORD:
            x_sums = tl.reduce(x_sums, 0, add, keep_dims=True)
        offsets = _group_values(o_ptr, rows_offset, chunk_cols, num_groups, GROUP)
        sums += offsets * (x_sums * (inverse / LEVEL_SCALE))
    return sums


@triton.jit(do_not_specialize=["N", "stride_ym"])
def _int4_row_gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, o_ptr, bias_ptr, out_ptr, N, K, num_words, num_groups, stride_qn, stride_gn,
    stride_xm, stride_ym, GROUP: tl.constexpr, ZERO_LOW: tl.constexpr, ZERO_HIGH: tl.constexpr, HAS_ZEROS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    C: tl.constexpr = BLOCK_K // 32
    offs_n, rows_offset, q_rows = weight_rows(q_ptr, N, stride_qn, stride_gn, BLOCK_N)
    row = tl.program_id(1).to(tl.int64)  # x's row: each its own programs, the weights shared through the L2
    x_ptr += row * stride_xm
    out_ptr += row * stride_ym
    x_pairs_ptr = x_ptr.to(tl.pointer_type(tl.int32))  # two columns of x an int32, as the packed arithmetic takes them
    word_ids, pair_ids = tile_ids(C)
    if EVEN_K:
        words = tl.load(q_rows + word_ids)
    else:
        words = tl.load(q_rows + word_ids, mask=word_ids < num_words, other=0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    sums = tl.full((4 if GROUP < 32 else 1, BLOCK_N, C), 0.0, tl.float32)  # a sum per word, or per chunk
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x_pairs = tl.load(x_pairs_ptr + (k >> 1) + pair_ids)
        else:
            x_pairs = tl.load(x_pairs_ptr + (k >> 1) + pair_ids, mask=k + pair_ids * 2 < K, other=0)
        if EVEN_K:  # the last tile's next re-reads it: a load without a mask, nothing to zero
            next_start = tl.multiple_of(tl.minimum(k + BLOCK_K, K - BLOCK_K) >> 3, 4)  # a whole tile's words
            next_words = tl.load(q_rows + word_ids + next_start)
        else:
            next_ids = word_ids + ((k + BLOCK_K) >> 3)
            next_words = tl.load(q_rows + next_ids, mask=next_ids < num_words, other=0)
        sums += tile_sums(words, x_pairs, k, s_ptr, z_ptr, o_ptr, rows_offset, num_groups, GROUP, ZERO_LOW,
                          ZERO_HIGH, HAS_ZEROS, HAS_OFFSETS, x_ptr.dtype.element_ty == tl.bfloat16, BLOCK_N, C)
        words = next_words
    y = tl.reduce(tl.reduce(sums, 2, add), 0, add) * LEVEL_SCALE  # [BLOCK_N]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def takes_row_gemv(weight: "IntWeight", x: torch.Tensor) -> bool:
    """Whether this kernel computes x @ W.T: up to MAX_ROWS rows of 16-bit activations, 4-bit levels in the stored
    column order (act order gathers x: the GEMV of gpu/kernels/quant_gemv.py), groups of whole words, K of whole
    chunks, x's rows aligned to a pair of columns."""
    return (x.shape[0] <= MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16) and weight.bits == 4
            and weight.perm is None and weight.group >= MIN_GROUP and x.shape[1] % CHUNK == 0
            and x.data_ptr() % 4 == 0 and x.stride(0) % 2 == 0)  # x read as pairs of columns, 4 bytes each


def int4_row_gemv(x: torch.Tensor, weight: "IntWeight", bias: torch.Tensor | None, y: torch.Tensor, t: GemvTiles,
                  pdl: bool) -> None:
    """y [M, N] = x [M, K] @ W.T (+ bias) for arguments gpu/kernels/int_gemm.py checked and `takes_row_gemv` takes,
    each row of x its own programs (a verifying step's few rows: each program as fast as one row's, where the
    tensor cores' tiles would pad the rows to 16 and split K).
    Each thread holds all `t.block_n` rows of its chunk (4 sums a row at most keep the loop in registers), and the
    warps split the columns: at most one warp per 32 chunks (`t.num_warps` a bound), since x's tile has no rows to
    spread warps over and its layout must be the weights'."""
    k, n, scales = x.shape[1], weight.weight.shape[0], weight.scales
    block_k = max(t.block_k, CHUNK)
    num_warps = max(1, min(t.num_warps, block_k // (CHUNK * 32)))
    _int4_row_gemv_kernel[(triton.cdiv(n, t.block_n), x.shape[0])](
        x, weight.weight, scales, pointer_or(weight.zeros, scales), pointer_or(weight.offsets, scales),
        pointer_or(bias, scales), y, n, k, weight.weight.shape[1], scales.shape[1], weight.weight.stride(0),
        scales.stride(0), x.stride(0) if x.shape[0] > 1 else 0, y.stride(0),  # 0 at one row: any x loads 16 bytes
        GROUP=weight.group, **zero_point_constexprs(weight.zero), HAS_ZEROS=weight.zeros is not None,
        HAS_OFFSETS=weight.offsets is not None, HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, USE_PDL=pdl,
        BLOCK_N=t.block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=1, launch_pdl=pdl,
        enable_fp_fusion=True)  # a multiply-add per weight, whatever Triton's default


def zero_point_constexprs(zero: float) -> dict[str, int]:
    """The kernel's ZERO_LOW and ZERO_HIGH for a constant zero point: -(1024 + zero) / 256 and -(64 + zero) / 256 in
    both halves of a float16 pair (nibbles_less_zero's)."""
    return {"ZERO_LOW": _f16x2_bits(-(1024 + zero) / LEVEL_SCALE.value),
            "ZERO_HIGH": _f16x2_bits(-(64 + zero) / LEVEL_SCALE.value)}


def _f16x2_bits(value: float) -> int:
    """`value` rounded to float16 in both halves of an int32 (signed, as the kernel's constant)."""
    half = int(torch.tensor(value, dtype=torch.float16).view(torch.int16).item()) & 0xFFFF
    return ((half << 16) | half) - (1 << 32 if half & 0x8000 else 0)
