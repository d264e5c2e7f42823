"""Triton paged attention for decode steps: one query token per row, split-KV (flash-decoding).

Grid (row, kv_head, split). A program loads the GROUP query heads that share one KV head as one
[BLOCK_H, head_dim] tile (GQA: each K/V tile is read once for the whole group), walks its segment
of the row's context through the block table BLOCK_N tokens at a time, and keeps an online softmax
in float32 (base 2, the scale folded together with log2(e)). With one split it writes the output
directly; with several it writes each segment's normalized partial output and log2-sum-exp, and a
second kernel merges the segments of each (row, head). Under programmatic dependent launch a program reads its
segment's first tile, all but the step's own token, before it waits for the kernel before (which writes q and that
token's K/V), so the block table and cache reads overlap that kernel's end.

Graph safety: the number of splits is fixed from static shapes only (rows, KV heads, block-table
width, the GPU's multiprocessor count), never from context lengths; each row cuts its own context
into at most that many segments on the GPU, and a program whose segment is empty writes an empty
partial (lse = -inf, zeros). A row with context_len 0 (a padding row of a captured batch) gets an
all-zero output. Every output element is written.

A layer's variant (gpu/attention/variant.py): with a sliding window W a row's segments cut only the tiles from
the one holding its first visible key (context_len - W), and the keys before it are masked out of that tile (not
loaded, nor their block-table entries read); sinks join the denominator where the softmax is finished (the
single-split program, or the merge); a soft-cap bends the scores before the softmax.
An FP8 cache (float8_e4m3fn) is read as it is, each tile converted to the query's dtype: its scales are the
caller's (the softmax scale and the output, gpu/layers/attention.py).
A program's segment walk and result are jit helpers (gpu/kernels/decode_segment.py), and a launch's grid, arguments
and merge a `SplitLaunch`, which the fused form (gpu/kernels/fused_decode_attention.py: queries and the own token's
K/V made from the raw QKV projection) shares.
"""

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.kernels.attention_variant import LOG2_E, softcap_factors
from gpu.kernels.decode_segment import attend_segment, load_kv, program_row, segment, store_segment, tile_offsets
from gpu.kernels.pdl import pdl_start, uses_pdl

# With at least NO_SPLIT_PROGRAMS_PER_SM (row, kv_head) programs per multiprocessor one split is best (more
# programs already fill the GPU); below that, splitting up to about SPLIT_PROGRAMS_PER_SM programs per multiprocessor
# keeps the GPU busy on few rows. A segment keeps at least MIN_SPLIT_TOKENS tokens to amortize its query load and its
# partial-result write.
NO_SPLIT_PROGRAMS_PER_SM = 2
SPLIT_PROGRAMS_PER_SM = 4
MIN_SPLIT_TOKENS = 64
MAX_SPLITS = 64
# Software-pipelining stages of the split kernel. A split launch (few rows) walks one or a few tiles per
# program, where deeper pipelining only delays the first tile; unsplit launches walk many and keep three.
UNSPLIT_NUM_STAGES = 3
SPLIT_NUM_STAGES = 1


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters; the defaults are the fastest measured over the decode and prefill shapes we serve."""

    block_n: int = 64  # KV tokens per tile
    num_warps: int = 4
    num_stages: int | None = None  # None: SPLIT_NUM_STAGES for a split launch, UNSPLIT_NUM_STAGES otherwise
    num_splits: int | None = None  # None: choose_num_splits(); a power of two otherwise


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    row_order_ptr,  # [num_rows] int32: which row each program-row runs (longest contexts first); or unused
    sinks_ptr,  # HAS_SINKS: [num_heads], any float dtype; else unused
    out_ptr,
    partial_out_ptr,  # [num_rows, num_heads, NUM_SPLITS, HEAD_DIM] float32
    partial_lse_ptr,  # [num_rows, num_heads, NUM_SPLITS] float32, log2 domain
    scale_log2,
    softcap_in,
    softcap_out,
    window,  # HAS_WINDOW: the sliding window W; else unused
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    cache_stride_b,
    cache_stride_s,
    cache_stride_h,
    table_stride_r,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_ROW_ORDER: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Everything up to the wait reads only what no kernel of this step writes (the lengths and block tables come
    # from the host, the cache's earlier tokens from earlier steps), so under PDL it runs while the kernel before
    # (the one storing this step's K/V and writing q) finishes: the segment's first tile but its own token.
    row = program_row(row_order_ptr, HAS_ROW_ORDER)
    kv_head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + row)
    first_key, tile_begin, tile_end = segment(context_len, window, BLOCK_N, NUM_SPLITS, HAS_WINDOW)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_h
    hd_mask = (offs_h < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    table_row = block_tables_ptr + row * table_stride_r

    positions, is_valid, kv_offsets = tile_offsets(table_row, tile_begin, tile_end, context_len, first_key, offs_n,
                                                    offs_d, kv_head, cache_stride_b, cache_stride_s, cache_stride_h,
                                                    BLOCK_SIZE, BLOCK_N, HAS_WINDOW)
    is_own = is_valid & (positions == context_len - 1)  # this step's token, stored by the kernel before
    is_settled = is_valid & (positions != context_len - 1)
    k_first = load_kv(k_cache_ptr, kv_offsets, is_settled, offs_d, HEAD_DIM, BLOCK_D, False)
    v_first = load_kv(v_cache_ptr, kv_offsets, is_settled, offs_d, HEAD_DIM, BLOCK_D, False)
    pdl_start(USE_PDL)
    # Past the wait, from L2 (.cg): this SM's L1 holds nothing of the token, whose lines no load above touched.
    k_own = load_kv(k_cache_ptr, kv_offsets, is_own, offs_d, HEAD_DIM, BLOCK_D, True)
    v_own = load_kv(v_cache_ptr, kv_offsets, is_own, offs_d, HEAD_DIM, BLOCK_D, True)
    k_first = tl.where(is_own[:, None], k_own, k_first)
    v_first = tl.where(is_own[:, None], v_own, v_first)
    q = tl.load(q_ptr + row * q_stride_t + heads[:, None] * q_stride_h + offs_d[None, :], mask=hd_mask, other=0.0)

    acc, m_i, l_i = attend_segment(
        q, (k_first, v_first, is_valid), (k_first, v_first), (tile_begin, tile_end),
        (table_row, context_len, first_key, kv_head), k_cache_ptr, v_cache_ptr,
        (cache_stride_b, cache_stride_s, cache_stride_h), (scale_log2, softcap_in, softcap_out),
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP, False)
    store_segment(acc, m_i, l_i, row, kv_head, sinks_ptr, out_ptr, (out_stride_t, out_stride_h),
                  (partial_out_ptr, partial_lse_ptr), GROUP, HEAD_DIM, NUM_SPLITS, HAS_SINKS)


@triton.jit
def _decode_reduce_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    sinks_ptr,  # HAS_SINKS: [num_heads]; else unused
    out_ptr,
    out_stride_t,
    out_stride_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    partial_rows = (row * num_heads + head) * NUM_SPLITS + offs_s
    lse = tl.load(partial_lse_ptr + partial_rows)
    lse_max = tl.max(lse, 0)
    if HAS_SINKS:  # the sink weighs in the denominator only
        sink_log2 = tl.load(sinks_ptr + head).to(tl.float32) * LOG2_E
        lse_max = tl.maximum(lse_max, sink_log2)
    # Empty segments (lse = -inf) weigh nothing; if all are empty the output is zeros.
    weights = tl.where(lse > float("-inf"), tl.exp2(lse - lse_max), 0.0)
    d_mask = offs_d < HEAD_DIM
    part_offsets = partial_rows[:, None] * HEAD_DIM + offs_d[None, :]
    parts = tl.load(partial_out_ptr + part_offsets, mask=d_mask[None, :], other=0.0)  # [NUM_SPLITS, BLOCK_D]
    total = tl.sum(weights, 0)
    if HAS_SINKS:
        total += tl.exp2(sink_log2 - lse_max)
    out = tl.sum(weights[:, None] * parts, 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + row * out_stride_t + head * out_stride_h + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # Triton's CPU interpreter: any fixed count will do
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_rows: int, num_kv_heads: int, max_context_tokens: int, num_sms: int) -> int:
    """Splits per row from static shapes only: enough programs to fill the GPU, segments not tiny."""
    num_programs = num_rows * num_kv_heads
    if num_programs >= NO_SPLIT_PROGRAMS_PER_SM * num_sms:
        return 1
    wanted = -(-SPLIT_PROGRAMS_PER_SM * num_sms // num_programs)
    useful = -(-max_context_tokens // MIN_SPLIT_TOKENS)
    splits = max(1, min(wanted, useful, MAX_SPLITS))
    return 1 << int(math.log2(splits))  # a power of two: few compiled variants, and arange-able


def decode_attention(
    query: torch.Tensor,  # [num_rows, num_heads, head_dim], one token per row
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_rows, max_blocks_per_row] int32
    context_lens: torch.Tensor,  # [num_rows] int32, including this step's token
    scale: float,
    out: torch.Tensor | None = None,  # [num_rows, num_heads, head_dim]; allocated when None
    config: DecodeConfig | None = None,
    row_order: torch.Tensor | None = None,  # [num_rows] int32, a permutation: launch order of the rows
    use_pdl: bool = False,  # programmatic dependent launches where the GPU has them (gpu/kernels/pdl.py)
    variant: AttentionVariant = PLAIN,  # the layer's window, sinks, soft-cap
) -> torch.Tensor:
    """Attention of each row's single query over its context (its window's part); no host sync, graph-capturable."""
    _check(query, k_cache, v_cache, block_tables, context_lens)
    out = torch.empty_like(query) if out is None else out
    if query.shape[0] == 0:
        return out
    launch = SplitLaunch.of(out, k_cache, (block_tables, context_lens, row_order), (scale, variant),
                            (config or DecodeConfig(), uses_pdl(use_pdl, query)))
    _decode_split_kernel[launch.grid](
        q_ptr=query, k_cache_ptr=k_cache, v_cache_ptr=v_cache, q_stride_t=query.stride(0), q_stride_h=query.stride(1),
        BLOCK_D=triton.next_power_of_2(query.shape[2]), **launch.arguments,
    )
    launch.merge(out)
    return out


@dataclass(frozen=True)
class SplitLaunch:
    """What a split kernel's launch takes besides its queries and cache, by argument name, for each form of the
    kernel (this file's, and gpu/kernels/fused_decode_attention.py's, which makes its queries itself); and the merge
    of its segments' partial results after it."""

    grid: tuple[int, int, int]  # (rows, kv heads, splits)
    arguments: dict[str, object]

    @staticmethod
    def of(out: torch.Tensor, k_cache: torch.Tensor,
           rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],  # block tables, context lengths, row order
           attention: tuple[float, AttentionVariant],  # scale, variant
           launch: tuple[DecodeConfig, bool]) -> "SplitLaunch":  # config, whether launched with PDL
        """The launch writing `out` [num_rows, num_heads, head_dim] (num_rows > 0)."""
        block_tables, context_lens, row_order = rows
        (scale, variant), (config, pdl) = attention, launch
        num_rows, num_heads, head_dim = out.shape
        num_blocks, block_size, num_kv_heads, _ = k_cache.shape
        max_keys = block_tables.shape[1] * block_size
        if variant.sliding_window is not None:  # a window's keys span at most one tile more than the window
            max_keys = min(max_keys, variant.sliding_window + config.block_n)
        num_splits = config.num_splits or choose_num_splits(num_rows, num_kv_heads, max_keys, _num_sms(out.device))
        group = num_heads // num_kv_heads
        if num_splits > 1:
            partial_out = torch.empty(num_rows, num_heads, num_splits, head_dim, dtype=torch.float32, device=out.device)
            partial_lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=out.device)
        else:
            partial_out = partial_lse = out  # unused by the kernel's single-split path
        # One row needs no launch order, and reading it would put a load before every other load of the kernel.
        has_row_order = row_order is not None and num_rows > 1
        softcap_in, softcap_out = softcap_factors(scale, variant.softcap)
        return SplitLaunch((num_rows, num_kv_heads, num_splits), dict(
            block_tables_ptr=block_tables, context_lens_ptr=context_lens,
            row_order_ptr=row_order if has_row_order else context_lens,
            sinks_ptr=variant.sinks if variant.sinks is not None else context_lens,
            out_ptr=out, partial_out_ptr=partial_out, partial_lse_ptr=partial_lse,
            scale_log2=scale * math.log2(math.e), softcap_in=softcap_in, softcap_out=softcap_out,
            window=variant.sliding_window or 0, out_stride_t=out.stride(0), out_stride_h=out.stride(1),
            cache_stride_b=k_cache.stride(0), cache_stride_s=k_cache.stride(1), cache_stride_h=k_cache.stride(2),
            table_stride_r=block_tables.stride(0),
            GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_H=max(16, triton.next_power_of_2(group)),
            BLOCK_N=config.block_n, NUM_SPLITS=num_splits,
            DOT_PRECISION="ieee" if out.dtype == torch.float32 else "tf32",
            HAS_ROW_ORDER=has_row_order, HAS_WINDOW=variant.sliding_window is not None,
            HAS_SINKS=variant.sinks is not None, HAS_SOFTCAP=variant.softcap is not None,
            USE_PDL=pdl, num_warps=config.num_warps,
            num_stages=config.num_stages or (SPLIT_NUM_STAGES if num_splits > 1 else UNSPLIT_NUM_STAGES),
            launch_pdl=pdl,
        ))

    def merge(self, out: torch.Tensor) -> None:
        """Merges the segments' partial results into `out` (nothing to do for one split)."""
        args = self.arguments
        num_splits = self.grid[2]
        if num_splits > 1:
            _decode_reduce_kernel[(out.shape[0], out.shape[1])](
                args["partial_out_ptr"], args["partial_lse_ptr"], args["sinks_ptr"], out, out.stride(0), out.stride(1),
                HEAD_DIM=out.shape[2], BLOCK_D=triton.next_power_of_2(out.shape[2]), NUM_SPLITS=num_splits,
                HAS_SINKS=args["HAS_SINKS"], USE_PDL=args["USE_PDL"], num_warps=4, launch_pdl=args["USE_PDL"],
            )


def _check(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    if query.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        shapes = f"query {tuple(query.shape)}, caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        raise ValueError(f"bad shapes: {shapes}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous (k and v share strides)")
    num_rows, num_heads, head_dim = query.shape
    if k_cache.shape[3] != head_dim or num_heads % k_cache.shape[2] != 0:
        raise ValueError(f"query heads {num_heads}x{head_dim} do not fit cache heads {tuple(k_cache.shape[2:])}")
    if query.stride(2) != 1 or k_cache.dtype not in (query.dtype, torch.float8_e4m3fn):
        raise ValueError(f"query needs unit stride along head_dim, and the cache its dtype or FP8 (got {query.dtype} "
                         f"and {k_cache.dtype})")
    if context_lens.shape != (num_rows,) or block_tables.dim() != 2 or block_tables.shape[0] != num_rows:
        raise ValueError(f"need context_lens [{num_rows}] and block_tables [{num_rows}, n] for a decode batch")
    if block_tables.stride(1) != 1 or block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("block_tables and context_lens must be int32, block_tables unit-strided per row")
