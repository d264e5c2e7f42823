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
Rows of several queries (a verifying step's k + 1, `queries_per_row`: consecutive queries of one sequence, each with
its own context length and the row's block table): one program per (row, KV head, split) runs every query of the row
with the group's heads as one [queries x GROUP, head_dim] tile, so each K/V tile is read once for all of them where a
program per query would read it k + 1 times; each query's keys are masked to its own context (and window), and a query
with no key in a segment gets an empty partial as above. Its outputs and partials are per query, as for decode rows.
An FP8 cache (float8_e4m3fn) is read as it is, each tile converted to the query's dtype: its scales are the
caller's (the softmax scale and the output, gpu/layers/attention.py). A 16-bit query over it multiplies in float16,
the query scaled into float16's range by about a power of two (FP8 converts to float16 in one instruction a pair,
to bf16 through float16), its K tiles are read transposed, as q.k's second operand reaches the tensor cores
(transposed in registers an 8-bit tile went through shared memory a byte a load), and its V tiles are converted
where loaded (`_in_dot_dtype`). A bf16 cache's K tiles are read as stored and transposed on the way to the tensor
cores, which measured faster for them.
"""

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.kernels.attention_variant import LOG2_E, log2_scores, softcap_factors, with_sinks
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import IS_INTERPRETED

# With at least NO_SPLIT_PROGRAMS_PER_SM (row, kv_head) programs per multiprocessor one split is best (more
# programs already fill the GPU); below that, splitting up to about SPLIT_PROGRAMS_PER_SM programs per multiprocessor
# keeps the GPU busy on few rows. A segment keeps at least MIN_SPLIT_TOKENS tokens to amortize its query load and its
# partial-result write.
NO_SPLIT_PROGRAMS_PER_SM = 2
SPLIT_PROGRAMS_PER_SM = 4
MIN_SPLIT_TOKENS = 64
MAX_SPLITS = 64
# Software-pipelining stages of the split kernel. A split launch (few rows) walks one or a few tiles per
# program, where deeper pipelining only delays the first tile; unsplit launches walk many and keep three, or two
# over an FP8 cache, whose tiles are converted in registers as they are loaded and leave less to overlap.
UNSPLIT_NUM_STAGES = 3
UNSPLIT_FP8_NUM_STAGES = 2
SPLIT_NUM_STAGES = 1


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters; the defaults are the fastest measured over the decode and prefill shapes we serve."""

    block_n: int = 64  # KV tokens per tile
    num_warps: int = 4
    num_stages: int | None = None  # None: _default_num_stages()
    num_splits: int | None = None  # None: choose_num_splits(); a power of two otherwise


@triton.jit
def _tile_offsets(table_row, tile, tile_end, context_len, first_key, offs_n, kv_head, cache_stride_b,
                  cache_stride_s, cache_stride_h, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  HAS_WINDOW: tl.constexpr):
    """A tile's key positions, which of them are keys to attend (none where `tile` is past the segment's end), and
    each key's offset [BLOCK_N] in the cache (its head's first element)."""
    positions = tile * BLOCK_N + offs_n
    is_valid = positions < tl.minimum(context_len, tile_end * BLOCK_N)  # the segment ends on a tile's edge
    if HAS_WINDOW:
        is_valid &= positions >= first_key
    pages = tl.load(table_row + positions // BLOCK_SIZE, mask=is_valid, other=0)
    token_offsets = pages.to(tl.int64) * cache_stride_b + (positions % BLOCK_SIZE) * cache_stride_s
    return positions, is_valid, token_offsets + kv_head * cache_stride_h


@triton.jit
def _load_kv(cache_ptr, key_offsets, is_loaded, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             FROM_L2: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The tile [BLOCK_N, BLOCK_D] (TRANSPOSED: [BLOCK_D, BLOCK_N]) of the keys where `is_loaded`, zeros elsewhere;
    FROM_L2: past this SM's L1 (.cg). Masked along tokens only when head_dim fills the tile, so loads stay 16 bytes
    wide."""
    if TRANSPOSED:
        offsets = key_offsets[None, :] + offs_d[:, None]
        mask = is_loaded[None, :]
        if HEAD_DIM != BLOCK_D:
            mask &= (offs_d < HEAD_DIM)[:, None]
    else:
        offsets = key_offsets[:, None] + offs_d[None, :]
        mask = is_loaded[:, None]
        if HEAD_DIM != BLOCK_D:
            mask &= (offs_d < HEAD_DIM)[None, :]
    if FROM_L2:
        return tl.load(cache_ptr + offsets, mask=mask, other=0.0, cache_modifier=".cg")
    return tl.load(cache_ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _tile_probs(q, k, mask, m_i, scale_log2, softcap_in, softcap_out, DOT_PRECISION: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, MAY_BE_EMPTY: tl.constexpr, K_TRANSPOSED: tl.constexpr):
    """A K tile's ([BLOCK_N, BLOCK_D], K_TRANSPOSED: [BLOCK_D, BLOCK_N]) unnormalized probabilities against the
    running max (base 2), the new max and the old sums' rescale. `mask`: the keys each row attends ([1, BLOCK_N]
    where all rows share them). MAY_BE_EMPTY: a row may have none in the tile and none before (its max stays -inf;
    its probabilities and rescale are zeros, not NaN)."""
    if K_TRANSPOSED:
        dot = tl.dot(q, k, input_precision=DOT_PRECISION)
    else:
        dot = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = log2_scores(dot, scale_log2, softcap_in, softcap_out, HAS_SOFTCAP)  # [BLOCK_H, BLOCK_N]
    scores = tl.where(mask, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_ref = m_new
    if MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return tl.exp2(scores - m_ref[:, None]), m_new, tl.exp2(m_i - m_ref)


@triton.jit
def _in_dot_dtype(v, q, FP8_AS_F16: tl.constexpr):
    """A V tile in q's dtype. An FP8 one in float16 (FP8_AS_F16) is converted four values a call to two
    `cvt.rn.f16x2.e4m3x2`, an operation not marked pure, which Triton then keeps where the tile was loaded: the P.V
    product needs V transposed, which a 16-bit tile gets from shared memory in `ldmatrix.trans`, where an 8-bit one
    converted past the transposition (Triton's own conversion, which it moves there) left it a byte a load."""
    if not FP8_AS_F16:
        return v.to(q.dtype)
    elif IS_INTERPRETED:
        return v.to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [v.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _scaled_f16_query(q):
    """q in float16, scaled by about a power of two that puts its largest magnitude near 2^13 (below float16's
    largest; bf16's 8 mantissa bits fit float16's 11, so only values 2^27 below the largest lose bits), and the factor
    that undoes the scaling on q.k."""
    q = q.to(tl.float32)
    shift = tl.floor(tl.log2(tl.maximum(tl.max(tl.max(tl.abs(q), 1), 0), 1e-30))) - 13.0
    return (q * tl.exp2(-shift)).to(tl.float16), tl.exp2(shift)


@triton.jit
def _keys_mask(is_valid, positions, row_lens, row_first_keys, QUERIES: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Which of a tile's keys each row attends: all the valid ones for one query a row; a row's own context (and
    window) where a program runs several queries of a row."""
    if QUERIES == 1:
        mask = is_valid[None, :]
    else:
        mask = is_valid[None, :] & (positions[None, :] < row_lens[:, None])
        if HAS_WINDOW:
            mask &= positions[None, :] >= row_first_keys[:, None]
    return mask


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
    partial_out_ptr,  # [num_rows, num_heads, NUM_SPLITS, HEAD_DIM] float32 (rows: queries)
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
    QUERIES: tl.constexpr,
    K_TRANSPOSED: tl.constexpr,
    FP8_AS_F16: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Everything up to the wait reads only what no kernel of this step writes (the lengths and block tables come
    # from the host, the cache's earlier tokens from earlier steps), so under PDL it runs while the kernel before
    # (the one storing this step's K/V and writing q) finishes: the segment's first tile but its own token.
    if HAS_ROW_ORDER:
        row = tl.load(row_order_ptr + tl.program_id(0)).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tl.arange(0, BLOCK_H)
    if QUERIES == 1:
        query_rows = row  # the output's row
        heads = kv_head * GROUP + offs_h
        is_row = offs_h < GROUP
        context_len = tl.load(context_lens_ptr + row)
        row_lens = context_len
        own_from = context_len - 1  # this step's token
        if HAS_WINDOW:
            first_key = tl.maximum(context_len - window, 0)
        else:
            first_key = context_len * 0
        row_first_keys = first_key
        table_row = block_tables_ptr + row * table_stride_r
    else:  # the tile's rows: each query of the row (QUERIES of them, in token order) times the group's heads
        query_rows = row * QUERIES + tl.minimum(offs_h // GROUP, QUERIES - 1)
        heads = kv_head * GROUP + offs_h % GROUP
        is_row = offs_h < QUERIES * GROUP
        row_lens = tl.load(context_lens_ptr + query_rows)
        context_len = tl.max(row_lens, 0)  # the segments cut the longest context
        own_from = tl.min(row_lens, 0) - 1  # this step's tokens
        if HAS_WINDOW:
            row_first_keys = tl.maximum(row_lens - window, 0)
        else:
            row_first_keys = row_lens * 0
        first_key = tl.min(row_first_keys, 0)
        table_row = block_tables_ptr + row * QUERIES * table_stride_r  # every query's is its row's
    first_tile = first_key // BLOCK_N
    num_tiles = tl.cdiv(context_len, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles - first_tile, NUM_SPLITS)
    tile_begin = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, num_tiles)

    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    hd_mask = is_row[:, None] & (offs_d < HEAD_DIM)[None, :]

    positions, is_valid, key_offsets = _tile_offsets(table_row, tile_begin, tile_end, context_len, first_key, offs_n,
                                                     kv_head, cache_stride_b, cache_stride_s, cache_stride_h,
                                                     BLOCK_SIZE, BLOCK_N, HAS_WINDOW)
    is_own = is_valid & (positions >= own_from)  # this step's tokens, stored by the kernel before
    is_settled = is_valid & (positions < own_from)
    k_first = _load_kv(k_cache_ptr, key_offsets, is_settled, offs_d, HEAD_DIM, BLOCK_D, False, K_TRANSPOSED)
    v_first = _load_kv(v_cache_ptr, key_offsets, is_settled, offs_d, HEAD_DIM, BLOCK_D, False, False)
    pdl_start(USE_PDL)
    # Past the wait, from L2 (.cg): this SM's L1 holds nothing of the token, whose lines no load above touched.
    k_own = _load_kv(k_cache_ptr, key_offsets, is_own, offs_d, HEAD_DIM, BLOCK_D, True, K_TRANSPOSED)
    v_own = _load_kv(v_cache_ptr, key_offsets, is_own, offs_d, HEAD_DIM, BLOCK_D, True, False)
    if K_TRANSPOSED:
        k_first = tl.where(is_own[None, :], k_own, k_first)
    else:
        k_first = tl.where(is_own[:, None], k_own, k_first)
    v_first = tl.where(is_own[:, None], v_own, v_first)
    q = tl.load(q_ptr + (query_rows * q_stride_t + heads * q_stride_h)[:, None] + offs_d[None, :], mask=hd_mask,
                other=0.0)
    if FP8_AS_F16:  # the tiles below convert to q's dtype: float16 now
        q, q_scale = _scaled_f16_query(q)
        scale_log2 = scale_log2 * q_scale
        softcap_in = softcap_in * q_scale

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if tile_begin < tile_end:  # an empty segment's all-masked tile would make the running max's rescale NaN
        mask = _keys_mask(is_valid, positions, row_lens, row_first_keys, QUERIES, HAS_WINDOW)
        p, m_i, alpha = _tile_probs(q, k_first.to(q.dtype), mask, m_i, scale_log2, softcap_in, softcap_out,
                                    DOT_PRECISION, HAS_SOFTCAP, QUERIES > 1, K_TRANSPOSED)  # tiles in q's dtype
        l_i = tl.sum(p, 1)
        acc = tl.dot(p.to(q.dtype), _in_dot_dtype(v_first, q, FP8_AS_F16), input_precision=DOT_PRECISION)
    for tile in range(tile_begin + 1, tile_end):
        positions, is_valid, key_offsets = _tile_offsets(table_row, tile, tile_end, context_len, first_key, offs_n,
                                                         kv_head, cache_stride_b, cache_stride_s, cache_stride_h,
                                                         BLOCK_SIZE, BLOCK_N, HAS_WINDOW)
        k = _load_kv(k_cache_ptr, key_offsets, is_valid, offs_d, HEAD_DIM, BLOCK_D, False, K_TRANSPOSED).to(q.dtype)
        mask = _keys_mask(is_valid, positions, row_lens, row_first_keys, QUERIES, HAS_WINDOW)
        p, m_i, alpha = _tile_probs(q, k, mask, m_i, scale_log2, softcap_in, softcap_out, DOT_PRECISION,
                                    HAS_SOFTCAP, QUERIES > 1, K_TRANSPOSED)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _in_dot_dtype(_load_kv(v_cache_ptr, key_offsets, is_valid, offs_d, HEAD_DIM, BLOCK_D, False, False), q,
                          FP8_AS_F16)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)

    # l_i == 0 only for an empty segment or context: its output is zeros, its weight zero.
    has_keys = l_i > 0.0
    if NUM_SPLITS == 1 and HAS_SINKS:  # the whole softmax is here: finish it with the sinks
        sinks_log2 = tl.load(sinks_ptr + heads, mask=is_row, other=0.0).to(tl.float32) * LOG2_E
        acc, l_i = with_sinks(acc, m_i, l_i, sinks_log2)
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        out_offsets = (query_rows * out_stride_t + heads * out_stride_h)[:, None] + offs_d[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=hd_mask)
    else:
        num_heads = tl.num_programs(1) * GROUP
        partial_rows = (query_rows * num_heads + heads) * NUM_SPLITS + split  # [BLOCK_H]
        tl.store(partial_out_ptr + partial_rows[:, None] * HEAD_DIM + offs_d[None, :], out, mask=hd_mask)
        lse = tl.where(has_keys, m_i + tl.log2(l_i), float("-inf"))
        tl.store(partial_lse_ptr + partial_rows, lse, mask=is_row)


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


def _default_num_stages(num_splits: int, is_fp8: bool) -> int:
    if num_splits > 1:
        return SPLIT_NUM_STAGES
    return UNSPLIT_FP8_NUM_STAGES if is_fp8 else UNSPLIT_NUM_STAGES


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
    queries_per_row: int = 1,  # rows of queries_per_row consecutive queries each, one program's (module docstring)
) -> torch.Tensor:
    """Attention of each row's single query over its context (its window's part); no host sync, graph-capturable."""
    _check(query, k_cache, v_cache, block_tables, context_lens)
    config = config or DecodeConfig()
    num_rows, num_heads, head_dim = query.shape
    if queries_per_row < 1 or num_rows % queries_per_row:
        raise ValueError(f"{num_rows} queries are no whole rows of {queries_per_row}")
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(query) if out is None else out
    if num_rows == 0:
        return out
    max_keys = block_tables.shape[1] * block_size
    if variant.sliding_window is not None:  # a window's keys span at most one tile more than the window
        max_keys = min(max_keys, variant.sliding_window + config.block_n)
    num_programs = num_rows // queries_per_row
    num_splits = config.num_splits or choose_num_splits(num_programs, num_kv_heads, max_keys, _num_sms(query.device))
    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    if num_splits > 1:
        partial_out = torch.empty(num_rows, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        partial_lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=query.device)
    else:
        partial_out = partial_lse = out  # unused by the kernel's single-split path
    is_fp8 = k_cache.dtype == torch.float8_e4m3fn
    num_stages = config.num_stages or _default_num_stages(num_splits, is_fp8)
    # One row needs no launch order, and reading it would put a load before every other load of the kernel.
    has_row_order = row_order is not None and num_rows > 1 and queries_per_row == 1
    pdl = uses_pdl(use_pdl, query)
    sinks = variant.sinks if variant.sinks is not None else context_lens
    _decode_split_kernel[(num_programs, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, context_lens, row_order if has_row_order else context_lens, sinks,
        out, partial_out, partial_lse,
        scale * math.log2(math.e), *softcap_factors(scale, variant.softcap), variant.sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_H=max(16, triton.next_power_of_2(group * queries_per_row)), BLOCK_D=block_d, BLOCK_N=config.block_n,
        NUM_SPLITS=num_splits, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        HAS_ROW_ORDER=has_row_order, HAS_WINDOW=variant.sliding_window is not None,
        HAS_SINKS=variant.sinks is not None, HAS_SOFTCAP=variant.softcap is not None, QUERIES=queries_per_row,
        K_TRANSPOSED=is_fp8, FP8_AS_F16=is_fp8 and query.dtype != torch.float32,
        USE_PDL=pdl, num_warps=config.num_warps, num_stages=num_stages, launch_pdl=pdl,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_rows, num_heads)](
            partial_out, partial_lse, sinks, out, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits, HAS_SINKS=variant.sinks is not None,
            USE_PDL=pdl, num_warps=4, launch_pdl=pdl,
        )
    return out


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
