"""Triton kernel: the W4A16 one-row GEMV of gpu/kernels/int4_row_gemv.py (its weights, tiles and packed float16
arithmetic: `tile_sums`) laid out to keep more weight bytes in flight a multiprocessor.

The row GEMV loads the next tile's words into registers while it multiplies the current one; compiled, ptxas moves
those loads to the end of the loop body (nothing in the iteration uses them, so a scheduler that saves registers
puts them last), and the next iteration waits on them almost the whole memory latency. Here:
- tiles PREFETCH ahead are fetched into L2 (`prefetch`: no registers, nothing waits on it), the first ones and the
  slice's scales (zero points, offsets) before waiting on the kernel that writes x (weights never depend on it), so
  the loads of a tile wait on L2, not memory, wherever ptxas places them;
- each iteration loads its own tile, a thread's BLOCK_N x BLOCK_K / (1,024 num_warps) 16-byte loads, several of
  each row where BLOCK_K spans more columns than the warps' threads; ptxas still spreads them over the iteration
  to save registers, unless IN_ORDER makes them volatile: ptxas keeps volatile accesses in order, and a volatile
  load of x's first pair after them, which every chunk of x waits on (x's other loads stay cached in L1), makes
  every weight load issue before the first use of any;
- where N makes too few programs to fill the multiprocessors, K is split over a second grid axis; the slices'
  float32 sums are added by gpu/kernels/fp8_gemm.py's reduce pass.

Rows past N re-read the last valid one, never stored; columns past K read zeros. Nothing depends on the data:
CUDA-graph capturable.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.fp8_gemm import reduce_split_k
from gpu.kernels.int4_row_gemv import LEVEL_SCALE, tile_ids, tile_sums, weight_rows, zero_point_constexprs
from gpu.kernels.quant_gemm_configs import WideGemvTiles
from gpu.kernels.quant_gemv import pointer_or
from gpu.kernels.triton_math import IS_INTERPRETED, add

if TYPE_CHECKING:
    from gpu.quant.int_weights import IntWeight

@triton.jit
def _prefetch_to_l2(pointers, is_wanted):
    """Fetch the lines holding `pointers` into L2 where `is_wanted` (a hint: nothing is read into registers, and
    Triton's interpreter skips it). The result is a dummy, for inline asm must have one."""
    if IS_INTERPRETED:
        pass
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }", "=r,l,r",
            [pointers, is_wanted.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_words(q_rows, k, k_end, C: tl.constexpr):
    """The tile of words from column k on into L2, its columns before k_end only (the program's slice): a prefetch at
    each 16-byte load's first word (every line, whatever L2's fetch granularity)."""
    chunk_cols = k + tl.arange(0, C)[None, None, :] * 32  # [1, 1, C]
    words = q_rows + (chunk_cols >> 3)  # [1, BLOCK_N, C]
    _prefetch_to_l2(words, tl.broadcast_to(chunk_cols < k_end, words.shape))


@triton.jit
def _prefetch_groups(ptr, rows_offset, k_start, k_end, num_groups, GROUP: tl.constexpr, C: tl.constexpr):
    """A per-group tensor's values for the program's slice into L2, a prefetch a 128-byte line (64 16-bit values) of
    each row: C lines a row at most."""
    first = k_start // GROUP
    last = tl.minimum((k_end - 1) // GROUP, num_groups - 1)
    groups = first + tl.arange(0, C)[None, None, :] * 64  # [1, 1, C]
    pointers = ptr + rows_offset + groups  # [1, BLOCK_N, C]
    _prefetch_to_l2(pointers, tl.broadcast_to(groups <= last, pointers.shape))


@triton.jit(do_not_specialize=["N"])
def _int4_wide_gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, o_ptr, bias_ptr, out_ptr, N, K, k_per_split, num_words, num_groups, stride_qn,
    stride_gn, stride_os,
    GROUP: tl.constexpr, ZERO_LOW: tl.constexpr, ZERO_HIGH: tl.constexpr, HAS_ZEROS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr, HAS_BIAS: tl.constexpr, IS_PARTIAL: tl.constexpr, EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH: tl.constexpr, IN_ORDER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    C: tl.constexpr = BLOCK_K // 32
    offs_n, rows_offset, q_rows = weight_rows(q_ptr, N, stride_qn, stride_gn, BLOCK_N)
    x_pairs_ptr = x_ptr.to(tl.pointer_type(tl.int32))  # two columns of x an int32, as the packed arithmetic takes them
    word_ids, pair_ids = tile_ids(C)
    k_start = tl.program_id(1) * k_per_split  # a whole number of tiles
    k_end = tl.minimum(k_start + k_per_split, K)
    if PREFETCH > 0:
        _prefetch_groups(s_ptr, rows_offset, k_start, k_end, num_groups, GROUP, C)
        if HAS_ZEROS:
            _prefetch_groups(z_ptr, rows_offset, k_start, k_end, num_groups, GROUP, C)
        if HAS_OFFSETS:
            _prefetch_groups(o_ptr, rows_offset, k_start, k_end, num_groups, GROUP, C)
    for ahead in tl.static_range(PREFETCH):
        _prefetch_words(q_rows, k_start + ahead * BLOCK_K, k_end, C)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    sums = tl.full((4 if GROUP < 32 else 1, BLOCK_N, C), 0.0, tl.float32)  # a sum per word, or per chunk
    for k in range(k_start, k_end, BLOCK_K):
        k_words = tl.multiple_of(k >> 3, 128)  # tiles start at multiples of 1,024 columns: 16-byte loads
        k_pairs = tl.multiple_of(k >> 1, 512)
        if EVEN_K:
            words = tl.load(q_rows + k_words + word_ids, volatile=IN_ORDER)
            x_pairs = tl.load(x_pairs_ptr + k_pairs + pair_ids)
        else:
            words = tl.load(q_rows + k_words + word_ids, mask=k_words + word_ids < num_words, other=0,
                            volatile=IN_ORDER)
            x_pairs = tl.load(x_pairs_ptr + k_pairs + pair_ids, mask=k + pair_ids * 2 < K, other=0)
        if IN_ORDER:  # x's first pair again, volatile, so after every word; each chunk's first pair waits on it (a
            # select the compiler cannot fold; it takes the pair's own value, where its condition holds at all)
            is_first = ((pair_ids & 15) == 0) & (pair_ids * 2 == k_start - k)
            x_pairs = tl.where(is_first, tl.load(x_pairs_ptr + k_pairs, volatile=True), x_pairs)
        if PREFETCH > 0:
            _prefetch_words(q_rows, k + PREFETCH * BLOCK_K, k_end, C)
        sums += tile_sums(words, x_pairs, k, s_ptr, z_ptr, o_ptr, rows_offset, num_groups, GROUP, ZERO_LOW,
                          ZERO_HIGH, HAS_ZEROS, HAS_OFFSETS, x_ptr.dtype.element_ty == tl.bfloat16, BLOCK_N, C)
    y = tl.reduce(tl.reduce(sums, 2, add), 0, add) * LEVEL_SCALE  # [BLOCK_N]
    if IS_PARTIAL:
        tl.store(out_ptr + tl.program_id(1) * stride_os + offs_n, y, mask=offs_n < N)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def int4_wide_gemv(x: torch.Tensor, weight: "IntWeight", bias: torch.Tensor | None, y: torch.Tensor,
                   t: WideGemvTiles, pdl: bool) -> None:
    """y [1, N] = x [1, K] @ W.T (+ bias) for arguments gpu/kernels/int_gemm.py checked and int4_row_gemv's
    `takes_row_gemv` takes. K splits into `t.split_k` slices of whole tiles at most (fewer where K is short), added
    by a second pass."""
    k, n, scales, block_k = x.shape[1], weight.weight.shape[0], weight.scales, t.block_k
    k_per_split = triton.cdiv(triton.cdiv(k, t.split_k), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    part = torch.empty((split, 1, n), dtype=torch.float32, device=x.device) if split > 1 else y
    _int4_wide_gemv_kernel[(triton.cdiv(n, t.block_n), split)](
        x, weight.weight, scales, pointer_or(weight.zeros, scales), pointer_or(weight.offsets, scales),
        pointer_or(bias, scales), part, n, k, k_per_split, weight.weight.shape[1], scales.shape[1],
        weight.weight.stride(0), scales.stride(0), part.stride(0) if split > 1 else 0,
        GROUP=weight.group, **zero_point_constexprs(weight.zero), HAS_ZEROS=weight.zeros is not None,
        HAS_OFFSETS=weight.offsets is not None, HAS_BIAS=bias is not None, IS_PARTIAL=split > 1,
        EVEN_K=k % block_k == 0, USE_PDL=pdl, PREFETCH=t.prefetch, IN_ORDER=t.in_order, BLOCK_N=t.block_n,
        BLOCK_K=block_k, num_warps=t.num_warps, num_stages=1, launch_pdl=pdl,
        enable_fp_fusion=True)  # a multiply-add per weight, whatever Triton's default
    if split > 1:
        reduce_split_k(part, bias, y, pdl)
