"""Triton attention for prefill chunks (and mixed batches): varying query lengths against paged KV.

A row's queries are the last query_len of its context_len tokens (cached prefix + this chunk);
query i sits at position context_len - query_len + i and sees keys 0..position (causal with an
offset). Decode rows are simply rows with query_len 1, so one launch serves a mixed batch.

Grid (q_tile, kv_head). A tile packs BLOCK_Q consecutive queries of one row times the GROUP query
heads of one KV head into BLOCK_M = BLOCK_Q * GROUP (padded) matrix rows, so each K/V tile read
through the block table serves the whole group. Row r owns tiles [r + start_r // BLOCK_Q, ...):
that numbering needs no host-side lengths (grid = num_tokens // BLOCK_Q + num_rows, an upper
bound), and a program finds its row by binary search over query_start_loc; surplus programs exit.
KV tiles wholly below the tile's first query position run without the causal mask.
Every query token of every row is written; tokens past query_start_loc[-1] are not.

A layer's variant (gpu/attention/variant.py): with a sliding window W a tile starts at the KV tile holding the
first key its earliest query sees (first position - W + 1), loads no key before that (nor its block-table
entry), and masks the window's lower edge in the tiles that some of its queries see only in part; sinks join
each query's denominator at the end; a soft-cap bends the scores before the mask. An FP8 cache (float8_e4m3fn)
is read as it is, each tile converted to the query's dtype (its scales are the caller's: gpu/layers/attention.py).
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.kernels.attention_variant import LOG2_E, log2_scores, softcap_factors, with_sinks


@dataclass(frozen=True)
class PrefillConfig:
    """Launch parameters; the defaults are the fastest measured over the decode and prefill shapes we serve."""

    block_m: int = 64  # query tokens x query heads per tile
    block_n: int = 64  # KV tokens per tile
    num_warps: int = 4
    num_stages: int = 2


@triton.jit
def _find_row(query_start_loc_ptr, q_tile, num_rows, BLOCK_Q: tl.constexpr):
    """The last row r whose first tile r + start_r // BLOCK_Q is <= q_tile."""
    lo = q_tile * 0  # a tensor even when num_rows is specialized to the constant 1
    hi = lo + (num_rows - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        is_at_or_before = first_tile <= q_tile
        lo = tl.where(is_at_or_before, mid, lo)
        hi = tl.where(is_at_or_before, hi, mid - 1)
    return lo


@triton.jit
def _attend_tile(
    q, m_i, l_i, acc, tile, q_positions, kv_len, lowest_key, window,
    k_cache_ptr, v_cache_ptr, table_row, kv_head, cache_stride_b, cache_stride_s, cache_stride_h,
    scale_log2, softcap_in, softcap_out,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):
    """One online-softmax step over KV tokens [tile * BLOCK_N, (tile + 1) * BLOCK_N), those before `lowest_key`
    (HAS_WINDOW) neither loaded nor seen."""
    offs_d = tl.arange(0, BLOCK_D)
    positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    is_valid = positions < kv_len
    if HAS_WINDOW:
        is_valid &= positions >= lowest_key
    pages = tl.load(table_row + positions // BLOCK_SIZE, mask=is_valid, other=0)
    token_offsets = pages.to(tl.int64) * cache_stride_b + (positions % BLOCK_SIZE) * cache_stride_s
    kv_offsets = (token_offsets + kv_head * cache_stride_h)[:, None] + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        kv_mask = is_valid[:, None]
    else:
        kv_mask = is_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(q.dtype)  # an FP8 cache's too
    dot = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = log2_scores(dot, scale_log2, softcap_in, softcap_out, HAS_SOFTCAP)  # [BLOCK_M, BLOCK_N]
    if IS_MASKED:
        is_visible = (positions[None, :] <= q_positions[:, None]) & is_valid[None, :]
        if HAS_WINDOW:
            is_visible &= positions[None, :] > q_positions[:, None] - window
        scores = tl.where(is_visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    if HAS_WINDOW:
        # A matrix row may see no key of its first tiles (its window starts later): exponents against 0 then,
        # so that row's terms stay zeros instead of -inf - -inf.
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    # Without a window every matrix row sees key 0 in the first tile, so m_new is finite from then on.
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


# num_rows changes every step: not specialized (on == 1, % 16), or a new value would compile a new variant
# in the middle of serving.
@triton.jit(do_not_specialize=["num_rows"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    query_start_loc_ptr,
    context_lens_ptr,
    block_tables_ptr,
    sinks_ptr,  # HAS_SINKS: [num_heads], any float dtype; else unused
    scale_log2,
    softcap_in,
    softcap_out,
    window,  # HAS_WINDOW: the sliding window W; else unused
    num_rows,
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
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
):
    q_tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = _find_row(query_start_loc_ptr, q_tile, num_rows, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + row)
    query_len = tl.load(query_start_loc_ptr + row + 1) - q_start
    local_tile = q_tile - (q_start // BLOCK_Q + row)
    if local_tile * BLOCK_Q >= query_len:
        return  # a surplus program of the upper-bound grid
    context_len = tl.load(context_lens_ptr + row)
    prefix_len = context_len - query_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_indices = local_tile * BLOCK_Q + offs_m // GROUP  # [BLOCK_M] query index within the row
    heads = kv_head * GROUP + offs_m % GROUP
    is_query = (offs_m < BLOCK_Q * GROUP) & (q_indices < query_len)
    q_positions = prefix_len + q_indices
    tokens = (q_start + q_indices).to(tl.int64)
    md_mask = is_query[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_offsets = tokens[:, None] * q_stride_t + heads[:, None] * q_stride_h + offs_d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=md_mask, other=0.0)  # [BLOCK_M, BLOCK_D]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + row.to(tl.int64) * table_stride_r
    first_position = prefix_len + local_tile * BLOCK_Q
    kv_len = prefix_len + tl.minimum((local_tile + 1) * BLOCK_Q, query_len)  # keys any query here sees
    num_tiles = tl.cdiv(kv_len, BLOCK_N)
    if HAS_WINDOW:
        lowest_key = tl.maximum(first_position - window + 1, 0)  # the earliest query's first key
        first_tile = lowest_key // BLOCK_N
        # From the tile holding the last query's first key on, no query's window cuts a tile.
        first_whole_tile = tl.minimum(tl.cdiv(tl.maximum(kv_len - window, 0), BLOCK_N), num_tiles)
    else:
        lowest_key = first_position * 0
        first_tile = lowest_key
        first_whole_tile = lowest_key
    # Tiles [first_whole_tile, unmasked_end) need no mask: every query sees all of them.
    unmasked_end = tl.maximum((first_position + 1) // BLOCK_N, first_whole_tile)
    for tile in range(first_tile, first_whole_tile):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, tile, q_positions, kv_len, lowest_key, window, k_cache_ptr, v_cache_ptr, table_row,
            kv_head, cache_stride_b, cache_stride_s, cache_stride_h, scale_log2, softcap_in, softcap_out,
            HEAD_DIM, BLOCK_SIZE, BLOCK_D, BLOCK_N, True, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP,
        )
    for tile in range(first_whole_tile, unmasked_end):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, tile, q_positions, kv_len, lowest_key, window, k_cache_ptr, v_cache_ptr, table_row,
            kv_head, cache_stride_b, cache_stride_s, cache_stride_h, scale_log2, softcap_in, softcap_out,
            HEAD_DIM, BLOCK_SIZE, BLOCK_D, BLOCK_N, False, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP,
        )
    for tile in range(unmasked_end, num_tiles):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, tile, q_positions, kv_len, lowest_key, window, k_cache_ptr, v_cache_ptr, table_row,
            kv_head, cache_stride_b, cache_stride_s, cache_stride_h, scale_log2, softcap_in, softcap_out,
            HEAD_DIM, BLOCK_SIZE, BLOCK_D, BLOCK_N, True, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP,
        )
    if HAS_SINKS:
        sinks_log2 = tl.load(sinks_ptr + heads).to(tl.float32) * LOG2_E
        acc, l_i = with_sinks(acc, m_i, l_i, sinks_log2)
    out = acc / l_i[:, None]
    out_offsets = tokens[:, None] * out_stride_t + heads[:, None] * out_stride_h + offs_d[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=md_mask)


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [num_rows + 1] int32
    context_lens: torch.Tensor,  # [num_rows] int32
    block_tables: torch.Tensor,  # [num_rows, max_blocks_per_row] int32
    scale: float,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; allocated when None
    config: PrefillConfig | None = None,
    variant: AttentionVariant = PLAIN,  # the layer's window, sinks, soft-cap
) -> torch.Tensor:
    """Causal attention of every row's queries over its paged context (within the window); no host sync."""
    _check(query, k_cache, v_cache, query_start_loc, context_lens, block_tables)
    config = config or PrefillConfig()
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_rows = context_lens.shape[0]
    out = torch.empty_like(query) if out is None else out
    if num_tokens == 0 or num_rows == 0:
        return out
    group = num_heads // num_kv_heads
    block_m = max(config.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    _prefill_kernel[(num_tokens // block_q + num_rows, num_kv_heads)](
        query, k_cache, v_cache, out, query_start_loc, context_lens, block_tables,
        variant.sinks if variant.sinks is not None else context_lens,
        scale * math.log2(math.e), *softcap_factors(scale, variant.softcap), variant.sliding_window or 0, num_rows,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_N=config.block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        HAS_WINDOW=variant.sliding_window is not None, HAS_SINKS=variant.sinks is not None,
        HAS_SOFTCAP=variant.softcap is not None, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def _check(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
) -> None:
    if query.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        shapes = f"query {tuple(query.shape)}, caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        raise ValueError(f"bad shapes: {shapes}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous (k and v share strides)")
    num_heads, head_dim = query.shape[1], query.shape[2]
    if k_cache.shape[3] != head_dim or num_heads % k_cache.shape[2] != 0:
        raise ValueError(f"query heads {num_heads}x{head_dim} do not fit cache heads {tuple(k_cache.shape[2:])}")
    if query.stride(2) != 1 or k_cache.dtype not in (query.dtype, torch.float8_e4m3fn):
        raise ValueError(f"query needs unit stride along head_dim, and the cache its dtype or FP8 (got {query.dtype} "
                         f"and {k_cache.dtype})")
    num_rows = context_lens.shape[0]
    if query_start_loc.shape != (num_rows + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != num_rows:
        raise ValueError(f"need query_start_loc [{num_rows + 1}] and block_tables [{num_rows}, n]")
    if any(t.dtype != torch.int32 for t in (query_start_loc, context_lens, block_tables)):
        raise ValueError("query_start_loc, context_lens and block_tables must be int32")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be unit-strided along each row")
