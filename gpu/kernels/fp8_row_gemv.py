"""Triton kernel: one row of x times FP8 (e4m3) weights as a GEMV, the row a decode step of one sequence multiplies,
with a scale per block of (SCALE_ROWS, GROUP) weights or one per row.

Each thread reads 16 bytes of a weight row at a time (4 words, a chunk of 16 consecutive columns: a 128-bit load)
for each of its rows, and once the 16 columns of x they multiply (8 pairs), made float16 pairs once for all its rows.
Tiles are [4 words, BLOCK_N rows, C chunks], the words of a chunk on the leading axis so that a thread's words and
x's [4, 1, C, 2] pairs fall to the same thread (no shared memory, no barrier in the loop).

The arithmetic is packed float16 (gpu/kernels/f16x2.py), since a float32 multiply-add per weight after two
conversions would issue more instructions than the memory delivers weights: each word's 4 codes become 2 float16
pairs in 2 conversions (exact: every e4m3 value is a float16), then 2 packed multiply-adds with x's pairs add them
into a float16 pair of sums through the chunk's 4 words. Once a chunk the pair's sums become float32 and the block's
scale multiplies them into float32 sums. Each chunk of x is first multiplied by the power of two that brings its
largest magnitude into [4, 8), exactly, and the chunk's sums by its inverse: 8 products a half of at most
448 * 8 stay below 2^15, and a chunk's x down to 2^-16 of its largest is exact in float16 (smaller ones, and products
below 2^-14, round at float16's subnormal spacing, 2^-24: below 2^-35 of the chunk's largest product). Products and
their sums round to float16 (a relative 2^-11 each, below the bf16 output's rounding). Rows past N re-read the last
valid one, never stored; the next weight tile is loaded before the current one is used, the first before waiting on
the kernel that writes x (gpu/kernels/pdl.py). Nothing depends on the data: CUDA-graph capturable.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.f16x2 import abs_max_x2, f16x2_fma, f16x2_of_bf16x2, f16x2_of_e4m3x4, f16x2_sum, mul_x2
from gpu.kernels.quant_gemm_configs import GemvTiles
from gpu.kernels.quant_gemv import pointer_or
from gpu.kernels.triton_math import add

CHUNK = 16  # columns a thread's 16-byte load holds
MAX_BLOCK_N = 8  # rows a thread holds: 16 rows' words, the tile's and the next's, spill registers


@triton.jit
def _words_apart(t, A: tl.constexpr, C: tl.constexpr):
    """[4, A, C] -> its 4 words, [A, C] each (a split within each thread's registers)."""
    even, odd = tl.split(tl.permute(t, (1, 2, 0)).reshape(A, C, 2, 2))  # [A, C, 2]: words 0 and 2, words 1 and 3
    word_0, word_2 = tl.split(even)
    word_1, word_3 = tl.split(odd)
    return word_0, word_1, word_2, word_3


@triton.jit
def _f16_x(x_pairs, C: tl.constexpr, IS_BF16: tl.constexpr):
    """x_pairs [4, 1, C, 2] (16-bit float pairs, bfloat16 where IS_BF16) as float16 pairs [4, 1, C] x 2, each chunk
    times 2^(TOP - e), e the exponent of its largest magnitude, and 2^(e - TOP) in float32 [1, 1, C] to undo it.
    Chunks too small for a power of two of x's type to reach [2^TOP, 2^(TOP+1)) take the largest it has (in bfloat16
    the largest whose inverse is a normal float32)."""
    x_0, x_1 = tl.split(x_pairs)  # columns 0-1 and 2-3 of each word, [4, 1, C]
    word_0, word_1, word_2, word_3 = _words_apart(abs_max_x2(x_0, x_1, IS_BF16), 1, C)
    largest = abs_max_x2(abs_max_x2(word_0, word_1, IS_BF16), abs_max_x2(word_2, word_3, IS_BF16), IS_BF16)
    TOP: tl.constexpr = 2  # the largest magnitude's exponent after scaling: 8 products of it and 448 below 2^15
    SHIFT: tl.constexpr = 7 if IS_BF16 else 10  # the exponent's lowest bit in a half
    BIAS: tl.constexpr = 127 if IS_BF16 else 15
    MASK: tl.constexpr = 2 * BIAS + 1
    exponent = tl.maximum((largest >> SHIFT) & MASK, (largest >> (SHIFT + 16)) & MASK)  # biased, [1, C]
    exponent = tl.maximum(exponent, max(BIAS - 96, 2))  # 2^(TOP - e) within x's type, 2^(e - TOP) normal
    scale = ((2 * BIAS + TOP - exponent) * ((1 << SHIFT) | (1 << (SHIFT + 16)))).reshape(1, 1, C)
    x_0, x_1 = mul_x2(x_0, scale, IS_BF16), mul_x2(x_1, scale, IS_BF16)
    if IS_BF16:
        x_0, x_1 = f16x2_of_bf16x2(x_0), f16x2_of_bf16x2(x_1)
    inverse = ((exponent - BIAS - TOP + 127) << 23).to(tl.float32, bitcast=True)
    return x_0, x_1, inverse.reshape(1, 1, C)


@triton.jit
def _chunk_dots(words, x_0, x_1, BLOCK_N: tl.constexpr, C: tl.constexpr):
    """sum over each chunk's 16 columns of w * x, a float16 sum per half of a pair, [1, BLOCK_N, C]: words [4,
    BLOCK_N, C] of 4 codes, x_0 and x_1 [4, 1, C] the pairs of x their columns 0-1 and 2-3 multiply."""
    pair_0, pair_1 = f16x2_of_e4m3x4(words)
    w_0, w_1, w_2, w_3 = _words_apart(pair_0, BLOCK_N, C)
    v_0, v_1, v_2, v_3 = _words_apart(pair_1, BLOCK_N, C)
    a_0, a_1, a_2, a_3 = _words_apart(x_0, 1, C)
    b_0, b_1, b_2, b_3 = _words_apart(x_1, 1, C)
    dots = f16x2_fma(w_0, a_0, tl.full((BLOCK_N, C), 0, tl.int32))
    dots = f16x2_fma(v_0, b_0, f16x2_fma(w_1, a_1, f16x2_fma(v_1, b_1, dots)))
    dots = f16x2_fma(v_2, b_2, f16x2_fma(w_2, a_2, dots))
    dots = f16x2_fma(v_3, b_3, f16x2_fma(w_3, a_3, dots))
    return dots.reshape(1, BLOCK_N, C)


@triton.jit(do_not_specialize=["N"])
def _fp8_row_gemv_kernel(
    x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, N, K, num_scale_cols, stride_wn, stride_wsn,
    SCALE_ROWS: tl.constexpr, GROUP: tl.constexpr, BLOCK_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, USE_PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    C: tl.constexpr = BLOCK_K // 16
    X_IS_BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)[None, :, None]  # [1, BLOCK_N, 1]
    scale_rows = ws_ptr + (rows_w // SCALE_ROWS) * stride_wsn
    w_rows = w_ptr.to(tl.pointer_type(tl.int32)) + rows_w * (stride_wn >> 2)
    x_pairs_ptr = x_ptr.to(tl.pointer_type(tl.int32))  # two columns of x an int32, as the packed arithmetic takes them
    # word w of chunk c, [4, 1, C]: 4 consecutive words a thread; x's 16 columns [4, 1, C, 2] (pairs) follow them
    word_ids = tl.arange(0, C)[None, None, :] * 4 + tl.arange(0, 4)[:, None, None]
    word_ids = tl.max_contiguous(tl.multiple_of(word_ids, [4, 1, 1]), [4, 1, 1])
    pair_ids = word_ids[:, :, :, None] * 2 + tl.arange(0, 2)[None, None, None, :]
    num_words = K >> 2
    if EVEN_K:
        words = tl.load(w_rows + word_ids)
    else:
        words = tl.load(w_rows + word_ids, mask=word_ids < num_words, other=0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    sums = tl.full((1, BLOCK_N, C), 0.0, tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x_pairs = tl.load(x_pairs_ptr + (k >> 1) + pair_ids)
        else:
            x_pairs = tl.load(x_pairs_ptr + (k >> 1) + pair_ids, mask=k + pair_ids * 2 < K, other=0)
        x_0, x_1, inverse = _f16_x(x_pairs, C, X_IS_BF16)
        if EVEN_K:  # the last tile's next re-reads it: a load without a mask
            next_start = tl.multiple_of(tl.minimum(k + BLOCK_K, K - BLOCK_K) >> 2, 4)
            next_words = tl.load(w_rows + word_ids + next_start)
        else:
            next_ids = word_ids + ((k + BLOCK_K) >> 2)
            next_words = tl.load(w_rows + next_ids, mask=next_ids < num_words, other=0)
        dots = f16x2_sum(_chunk_dots(words, x_0, x_1, BLOCK_N, C))  # [1, BLOCK_N, C] float32
        if BLOCK_SCALES:
            chunk_cols = k + tl.arange(0, C)[None, None, :] * 16
            ids = tl.minimum((chunk_cols.to(tl.uint32) // GROUP).to(tl.int32), num_scale_cols - 1)
            sums += (tl.load(scale_rows + ids).to(tl.float32) * inverse) * dots
        else:
            sums += inverse * dots
        words = next_words
    y = tl.reduce(tl.reduce(sums, 2, add), 0, add)  # [BLOCK_N]
    if not BLOCK_SCALES:  # a scale per row: on the sums
        y *= tl.load(scale_rows).to(tl.float32).reshape(BLOCK_N)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def takes_fp8_row_gemv(x: torch.Tensor, weight: torch.Tensor, group: int | None) -> bool:
    """Whether this kernel computes x @ W.T: one row of 16-bit activations, K of whole chunks, scale blocks of whole
    chunks (or one scale per row), x and the weight rows aligned to 4 bytes (read as int32)."""
    return (x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16) and x.shape[1] % CHUNK == 0
            and (group is None or group % CHUNK == 0) and x.data_ptr() % 4 == 0 and weight.data_ptr() % 4 == 0
            and weight.stride(0) % 4 == 0)


def fp8_row_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor, scale_rows: int,
                 group: int | None, bias: torch.Tensor | None, y: torch.Tensor, t: GemvTiles, pdl: bool) -> None:
    """y [1, N] = x [1, K] @ dequantized(weight).T (+ bias) for arguments gpu/kernels/fp8_gemm.py checked and
    `takes_fp8_row_gemv` takes: quant_gemv.fp8_gemv's. The warps split the columns: at most one warp per 32 chunks."""
    k, n = x.shape[1], weight.shape[0]
    block_n, block_k, num_warps = launch_shape(t)
    _fp8_row_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, weight_scales, pointer_or(bias, weight_scales), y, n, k, weight_scales.shape[1], weight.stride(0),
        weight_scales.stride(0), SCALE_ROWS=scale_rows, GROUP=group or block_k, BLOCK_SCALES=group is not None,
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, USE_PDL=pdl, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=1, launch_pdl=pdl, enable_fp_fusion=True)


def launch_shape(t: GemvTiles) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) the kernel runs a GEMV tile as: at most MAX_BLOCK_N rows, and at most one warp per
    32 chunks (x's tile has no rows to spread warps over and its layout must be the weights')."""
    block_k = max(t.block_k, CHUNK)
    return min(t.block_n, MAX_BLOCK_N), block_k, max(1, min(t.num_warps, block_k // (CHUNK * 32)))
