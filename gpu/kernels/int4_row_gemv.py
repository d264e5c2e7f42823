"""Triton kernel: one row of x times 4-bit weights (W4A16: GPTQ, AWQ, compressed-tensors' pack-quantized, GGUF's
4-bit blocks, all in gpu/quant/int_weights.py's `IntWeight` form) as a GEMV, the row a decode step of one sequence
multiplies.

The weights stay in their stored layout (int32 [N, K / 8], a word's 8 columns in pairs in its two 16-bit halves).
Each thread reads 16 bytes of a weight row at a time (4 words, 32 consecutive columns: a 128-bit load) for each of
its rows, and once the 32 columns of x they multiply (four 16-byte loads, converted once for all its rows). Tiles are
[4 words, BLOCK_N rows, C chunks of 32 columns], the 4 words of a chunk on the leading axis so that a thread's words
and x's [4, 1, C, 8] columns fall to the same thread (no tile crosses threads in the loop: no shared memory, no
barrier); x's 8 columns of a word split into 8 tensors in registers, one per level of the word. A level becomes a
float with no conversion instruction: shifted to bits 19-22 and ORed into 1.0's bits it is v = 1 + level / 16,
exactly. Per group of columns, with scale s, zero point z and offset o, sum_k w_k x_k = 16 s sum_k v_k x_k -
(s (16 + z) - o) sum_k x_k: a multiply-add per weight into float32 sums of each chunk (each word, for groups narrower
than a chunk), on which the scales act once a chunk; the rows reduce across threads once, after the loop. No split-K:
narrow column blocks make programs enough.

The next weight tile is loaded before the current one is used, and the first before waiting on the kernel that
writes x (programmatic dependent launch, gpu/kernels/pdl.py): weights never depend on it. Rows past N re-read the
last valid one, never stored. Nothing depends on the data: CUDA-graph capturable.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.quant_gemm_configs import GemvTiles
from gpu.kernels.quant_gemv import pointer_or
from gpu.kernels.triton_math import add

if TYPE_CHECKING:
    from gpu.quant.int_weights import IntWeight

CHUNK = 32  # columns a thread's 16-byte load holds
MIN_GROUP = 8  # a group spans whole words: narrower groups take gpu/kernels/quant_gemv.py
# 1.0's bits, passed as an argument: the instruction that masks a level and ORs them in (LOP3) holds one immediate,
# and an argument sits in the constant bank, so no register is spent on a second constant in the loop
ONE_BITS = 0x3F800000


@triton.jit
def _group_values(ptr, rows_offset, chunk_cols, num_groups, GROUP: tl.constexpr):
    """A per-group tensor's values in float32, [1, BLOCK_N, C] a chunk (groups of a chunk or wider), else
    [4, BLOCK_N, C] a word (groups past the last, which multiply x's zeros, read the last)."""
    if GROUP >= 32:
        ids = chunk_cols // GROUP
    else:
        ids = (chunk_cols + tl.arange(0, 4)[:, None, None] * 8) // GROUP
    return tl.load(ptr + rows_offset + tl.minimum(ids, num_groups - 1)).to(tl.float32)


@triton.jit
def _unit_float(words, one_bits, BIT: tl.constexpr):
    """The level at bit BIT of each word as the float32 1 + level / 16: moved to bits 19-22, the top of 1.0's
    mantissa (no conversion instruction)."""
    if BIT >= 19:
        moved = words >> (BIT - 19)
    else:
        moved = words << (19 - BIT)
    return ((moved & 0x00780000) | one_bits).to(tl.float32, bitcast=True)


@triton.jit
def _halves(t, C: tl.constexpr, SIZE: tl.constexpr):
    """[4, 1, C, SIZE] -> its even and odd entries of the last axis, [4, 1, C, SIZE / 2] each: a split within each
    thread's registers."""
    return tl.split(t.reshape(4, 1, C, SIZE // 2, 2))


@triton.jit
def _dot_columns(words, x, one_bits, C: tl.constexpr):
    """sum over a word's 8 columns of (1 + level / 16) * x, [4, BLOCK_N, C]: x [4, 1, C, 8] split into its columns
    (column 2j + h at bit 4j + 16h of the word, gpu/quant/int_weights.py's pairs), one multiply-add each."""
    x_h0, x_h1 = _halves(x, C, 8)  # [4, 1, C, 4] by j, of h = 0 / 1
    x_00, x_01 = _halves(x_h0, C, 4)  # [4, 1, C, 2] by j // 2, of j even / odd
    x_10, x_11 = _halves(x_h1, C, 4)
    x_at_0, x_at_8 = tl.split(x_00)  # [4, 1, C]: the column at bit 0 of the word, at bit 8
    x_at_4, x_at_12 = tl.split(x_01)
    x_at_16, x_at_24 = tl.split(x_10)
    x_at_20, x_at_28 = tl.split(x_11)
    dots = _unit_float(words, one_bits, 0) * x_at_0
    dots += _unit_float(words, one_bits, 4) * x_at_4
    dots += _unit_float(words, one_bits, 8) * x_at_8
    dots += _unit_float(words, one_bits, 12) * x_at_12
    dots += _unit_float(words, one_bits, 16) * x_at_16
    dots += _unit_float(words, one_bits, 20) * x_at_20
    dots += _unit_float(words, one_bits, 24) * x_at_24
    dots += _unit_float(words, one_bits, 28) * x_at_28
    return dots


@triton.jit(do_not_specialize=["N"])
def _int4_row_gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, o_ptr, bias_ptr, out_ptr, N, K, num_words, num_groups, stride_qn, stride_gn, one_bits,
    GROUP: tl.constexpr, ZERO: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, USE_PDL: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    C: tl.constexpr = BLOCK_K // 32
    BY_WORD: tl.constexpr = GROUP < 32  # a scale per word, else per chunk
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)[None, :, None]  # [1, BLOCK_N, 1]
    rows_offset = rows_w * stride_gn
    q_rows = q_ptr + rows_w * stride_qn
    # word w of chunk c, [4, 1, C]: 4 consecutive words a thread; x's 32 columns [4, 1, C, 8] follow them
    word_ids = tl.arange(0, C)[None, None, :] * 4 + tl.arange(0, 4)[:, None, None]
    word_ids = tl.max_contiguous(tl.multiple_of(word_ids, [4, 1, 1]), [4, 1, 1])
    columns = word_ids[:, :, :, None] * 8 + tl.arange(0, 8)[None, None, None, :]
    if EVEN_K:
        words = tl.load(q_rows + word_ids)
    else:
        words = tl.load(q_rows + word_ids, mask=word_ids < num_words, other=0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    sums = tl.full((4 if BY_WORD else 1, BLOCK_N, C), 0.0, tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptr + k + columns).to(tl.float32)
        else:
            x = tl.load(x_ptr + k + columns, mask=k + columns < K, other=0.0).to(tl.float32)
        next_ids = word_ids + (k + BLOCK_K) // 8
        next_words = tl.load(q_rows + next_ids, mask=next_ids < num_words, other=0)
        dots = _dot_columns(words, x, one_bits, C)  # [4, BLOCK_N, C]
        x_sums = tl.reduce(x, 3, add)  # [4, 1, C]
        if not BY_WORD:
            dots = tl.reduce(dots, 0, add, keep_dims=True)
            x_sums = tl.reduce(x_sums, 0, add, keep_dims=True)
        chunk_cols = k + tl.arange(0, C)[None, None, :] * 32
        scales = _group_values(s_ptr, rows_offset, chunk_cols, num_groups, GROUP)
        if HAS_ZEROS:
            coefficient = scales * (16.0 + _group_values(z_ptr, rows_offset, chunk_cols, num_groups, GROUP))
        else:
            coefficient = scales * (16.0 + ZERO)
        if HAS_OFFSETS:
            coefficient -= _group_values(o_ptr, rows_offset, chunk_cols, num_groups, GROUP)
        sums += (16.0 * scales) * dots - coefficient * x_sums
        words = next_words
    y = tl.reduce(tl.reduce(sums, 2, add), 0, add)  # [BLOCK_N]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def takes_row_gemv(weight: "IntWeight", x: torch.Tensor) -> bool:
    """Whether this kernel computes x @ W.T: one row of 16-bit activations, 4-bit levels in the stored column order
    (act order gathers x: the GEMV of gpu/kernels/quant_gemv.py), groups of whole words, K of whole chunks."""
    return (x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16) and weight.bits == 4
            and weight.perm is None and weight.group >= MIN_GROUP and x.shape[1] % CHUNK == 0)


def int4_row_gemv(x: torch.Tensor, weight: "IntWeight", bias: torch.Tensor | None, y: torch.Tensor, t: GemvTiles,
                  pdl: bool) -> None:
    """y [1, N] = x [1, K] @ W.T (+ bias) for arguments gpu/kernels/int_gemm.py checked and `takes_row_gemv` takes.
    Each thread holds all `t.block_n` rows of its chunk (4 sums a row at most keep the loop in registers), and the
    warps split the columns: at most one warp per 32 chunks (`t.num_warps` a bound), since x's tile has no rows to
    spread warps over and its layout must be the weights'."""
    k, n, scales = x.shape[1], weight.weight.shape[0], weight.scales
    block_k = max(t.block_k, CHUNK)
    num_warps = max(1, min(t.num_warps, block_k // (CHUNK * 32)))
    _int4_row_gemv_kernel[(triton.cdiv(n, t.block_n),)](
        x, weight.weight, scales, pointer_or(weight.zeros, scales), pointer_or(weight.offsets, scales),
        pointer_or(bias, scales), y, n, k, weight.weight.shape[1], scales.shape[1], weight.weight.stride(0),
        scales.stride(0), ONE_BITS,
        GROUP=weight.group, ZERO=weight.zero, HAS_ZEROS=weight.zeros is not None,
        HAS_OFFSETS=weight.offsets is not None, HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, USE_PDL=pdl,
        BLOCK_N=t.block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=1, launch_pdl=pdl,
        enable_fp_fusion=True)  # a multiply-add per weight, whatever Triton's default

