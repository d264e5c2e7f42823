"""One program's segment of a split-KV decode (flash-decoding) launch, as jit helpers: which row it runs, which tiles
of the row's context are its segment, the online softmax over them and where its result goes. Shared by the two forms
of the split kernel, gpu/kernels/decode_attention.py's (queries given) and gpu/kernels/fused_decode_attention.py's
(queries and the own token's K/V made from the raw QKV projection), so both walk and reduce their tiles alike.
Segments are disjoint and cover a row's visible context on tile edges; the last one (by tile order) holds the row's
own (last) token.
"""

import triton
import triton.language as tl

from gpu.kernels.attention_variant import LOG2_E, log2_scores, with_sinks


@triton.jit
def tile_offsets(table_row, tile, tile_end, context_len, first_key, offs_n, offs_d, kv_head, cache_stride_b,
                  cache_stride_s, cache_stride_h, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  HAS_WINDOW: tl.constexpr):
    """A tile's key positions, which of them are keys to attend (none where `tile` is past the segment's end), and
    their K/V offsets [BLOCK_N, BLOCK_D] in the cache."""
    positions = tile * BLOCK_N + offs_n
    is_valid = positions < tl.minimum(context_len, tile_end * BLOCK_N)  # the segment ends on a tile's edge
    if HAS_WINDOW:
        is_valid &= positions >= first_key
    pages = tl.load(table_row + positions // BLOCK_SIZE, mask=is_valid, other=0)
    token_offsets = pages.to(tl.int64) * cache_stride_b + (positions % BLOCK_SIZE) * cache_stride_s
    return positions, is_valid, (token_offsets + kv_head * cache_stride_h)[:, None] + offs_d[None, :]


@triton.jit
def load_kv(cache_ptr, kv_offsets, is_loaded, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             FROM_L2: tl.constexpr):
    """The tile's rows where `is_loaded`, zeros elsewhere; FROM_L2: past this SM's L1 (.cg). Masked along tokens only
    when head_dim fills the tile, so loads stay 16 bytes wide."""
    if HEAD_DIM == BLOCK_D:
        mask = is_loaded[:, None]
    else:
        mask = is_loaded[:, None] & (offs_d < HEAD_DIM)[None, :]
    if FROM_L2:
        return tl.load(cache_ptr + kv_offsets, mask=mask, other=0.0, cache_modifier=".cg")
    return tl.load(cache_ptr + kv_offsets, mask=mask, other=0.0)


@triton.jit
def tile_probs(q, k, is_valid, m_i, scale_log2, softcap_in, softcap_out, DOT_PRECISION: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr):
    """A K tile's unnormalized probabilities against the running max (base 2), the new max and the old sums' rescale."""
    dot = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = log2_scores(dot, scale_log2, softcap_in, softcap_out, HAS_SOFTCAP)  # [BLOCK_H, BLOCK_N]
    scores = tl.where(is_valid[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    return tl.exp2(scores - m_new[:, None]), m_new, tl.exp2(m_i - m_new)


@triton.jit
def program_row(row_order_ptr, HAS_ROW_ORDER: tl.constexpr):
    """The row this program runs: its place in the launch order (longest contexts first) where one is given."""
    if HAS_ROW_ORDER:
        return tl.load(row_order_ptr + tl.program_id(0)).to(tl.int64)
    return tl.program_id(0).to(tl.int64)


@triton.jit
def segment(context_len, window, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """(first_key, tile_begin, tile_end): the row's first visible key and this program's split's tiles [begin, end)
    of the row's context, empty where the row has fewer tiles than splits."""
    if HAS_WINDOW:
        first_key = tl.maximum(context_len - window, 0)
    else:
        first_key = context_len * 0
    first_tile = first_key // BLOCK_N
    num_tiles = tl.cdiv(context_len, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles - first_tile, NUM_SPLITS)
    tile_begin = first_tile + tl.program_id(2) * tiles_per_split
    return first_key, tile_begin, tl.minimum(tile_begin + tiles_per_split, num_tiles)


@triton.jit
def attend_segment(q, first_tile, own_kv, tile_range, context, k_cache_ptr, v_cache_ptr, cache_strides, scores,
                   HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_OWN_KV: tl.constexpr):
    """(acc, m_i, l_i): the online softmax of q's heads [BLOCK_H, BLOCK_D] over the segment's tiles, the first one's
    K/V and key mask given (`first_tile`: k, v, is_valid), the others read here. HAS_OWN_KV: the row's own (last)
    key and value are `own_kv` ([1, BLOCK_D] each, as the cache holds them), not read from the cache in any tile.
    `tile_range` is (begin, end), `context` (block-table row, context_len, first_key, kv_head), `cache_strides`
    (block, slot, head), `scores` (scale_log2, softcap_in, softcap_out)."""
    k_first, v_first, is_valid = first_tile
    k_own, v_own = own_kv
    tile_begin, tile_end = tile_range
    table_row, context_len, first_key, kv_head = context
    cache_stride_b, cache_stride_s, cache_stride_h = cache_strides
    scale_log2, softcap_in, softcap_out = scores
    BLOCK_H: tl.constexpr = q.shape[0]
    BLOCK_D: tl.constexpr = q.shape[1]
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if tile_begin < tile_end:  # an empty segment's all-masked tile would make the running max's rescale NaN
        p, m_i, alpha = tile_probs(q, k_first.to(q.dtype), is_valid, m_i, scale_log2, softcap_in, softcap_out,
                                    DOT_PRECISION, HAS_SOFTCAP)  # an FP8 cache's tiles in q's dtype
        l_i = tl.sum(p, 1)
        acc = tl.dot(p.to(q.dtype), v_first.to(q.dtype), input_precision=DOT_PRECISION)
    for tile in range(tile_begin + 1, tile_end):
        positions, is_valid, kv_offsets = tile_offsets(table_row, tile, tile_end, context_len, first_key, offs_n,
                                                        offs_d, kv_head, cache_stride_b, cache_stride_s,
                                                        cache_stride_h, BLOCK_SIZE, BLOCK_N, HAS_WINDOW)
        if HAS_OWN_KV:
            is_own = (positions == context_len - 1)[:, None]
            k = tl.where(is_own, k_own, load_kv(k_cache_ptr, kv_offsets, is_valid & (positions != context_len - 1),
                                                 offs_d, HEAD_DIM, BLOCK_D, False)).to(q.dtype)
        else:
            k = load_kv(k_cache_ptr, kv_offsets, is_valid, offs_d, HEAD_DIM, BLOCK_D, False).to(q.dtype)
        p, m_i, alpha = tile_probs(q, k, is_valid, m_i, scale_log2, softcap_in, softcap_out, DOT_PRECISION,
                                    HAS_SOFTCAP)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_OWN_KV:
            v = tl.where(is_own, v_own, load_kv(v_cache_ptr, kv_offsets, is_valid & (positions != context_len - 1),
                                                 offs_d, HEAD_DIM, BLOCK_D, False)).to(q.dtype)
        else:
            v = load_kv(v_cache_ptr, kv_offsets, is_valid, offs_d, HEAD_DIM, BLOCK_D, False).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def store_segment(acc, m_i, l_i, row, kv_head, sinks_ptr, out_ptr, out_strides, partials, GROUP: tl.constexpr,
                  HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The segment's result: with one split the row's output (the sinks joined to its softmax), else its normalized
    partial output and log2-sum-exp (`partials`: their pointers) for the merge."""
    out_stride_t, out_stride_h = out_strides
    partial_out_ptr, partial_lse_ptr = partials
    BLOCK_H: tl.constexpr = acc.shape[0]
    BLOCK_D: tl.constexpr = acc.shape[1]
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_h
    hd_mask = (offs_h < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    # l_i == 0 only for an empty segment or context: its output is zeros, its weight zero.
    has_keys = l_i > 0.0
    if NUM_SPLITS == 1 and HAS_SINKS:  # the whole softmax is here: finish it with the sinks
        sinks_log2 = tl.load(sinks_ptr + heads, mask=offs_h < GROUP, other=0.0).to(tl.float32) * LOG2_E
        acc, l_i = with_sinks(acc, m_i, l_i, sinks_log2)
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        out_offsets = row * out_stride_t + heads[:, None] * out_stride_h + offs_d[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=hd_mask)
    else:
        num_heads = tl.num_programs(1) * GROUP
        partial_rows = (row * num_heads + heads) * NUM_SPLITS + tl.program_id(2)  # [BLOCK_H]
        tl.store(partial_out_ptr + partial_rows[:, None] * HEAD_DIM + offs_d[None, :], out, mask=hd_mask)
        lse = tl.where(has_keys, m_i + tl.log2(l_i), float("-inf"))
        tl.store(partial_lse_ptr + partial_rows, lse, mask=offs_h < GROUP)
