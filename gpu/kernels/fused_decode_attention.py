"""Triton decode attention from the raw QKV projection: qk_norm_rope_store_kv (gpu/kernels/qk_norm_rope.py) and
decode_attention's split kernel (gpu/kernels/decode_attention.py) in one launch, for a decode step (one query token
per row).

Grid (row, kv_head, split), as decode_attention's. Each program makes its GROUP query heads itself from the row of
qkv (normed and rotated as qk_norm_rope makes them, by the same jit helper, so the same rounding), then walks its
segment of the row's context as decode_attention does, with the same helpers. The program whose segment holds the
row's own (last) token also makes that token's key for its KV head, writes the key and the value to the cache
exactly as qk_norm_rope_store_kv writes them (its slot from slot_mapping; an FP8 cache's scaling; nothing for a slot
of -1), and attends to them from its registers, never from the cache. No other program reads the own token (segments
are disjoint, and it lies in the last), so no program waits on another's store: there is no ordering between
programs to keep.
Under programmatic dependent launch a program reads its segment's first tile but the own token, and its row's position
and slot, before it waits for the kernel before, which writes qkv: the lengths, tables, positions and slots come from
the host, the cache's earlier tokens from earlier steps.
Queries are not written out: only the attention's output, and the merge's when the rows' contexts are split.
"""

import torch
import triton
import triton.language as tl

from gpu.attention.qkv_heads import QkvHeads
from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.kernels.decode_attention import DecodeConfig, SplitLaunch
from gpu.kernels.decode_attention import _check as _check_decode
from gpu.kernels.decode_segment import attend_segment, load_kv, program_row, segment, store_segment, tile_offsets
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.qk_norm_rope import _check as _check_qk
from gpu.kernels.qk_norm_rope import _check_kv_cache, cache_value, normed_rotated_halves
from gpu.kernels.triton_math import round_to


@triton.jit
def _whole_heads(first, second):
    """Heads [rows, 2 * half] from their halves [rows, half]."""
    rows: tl.constexpr = first.shape[0]
    half: tl.constexpr = first.shape[1]
    return tl.reshape(tl.permute(tl.join(first, second), (0, 2, 1)), (rows, 2 * half))


@triton.jit
def _own_kv(token_row, kv_head, position, rotary, norm, k_cache_ptr, v_cache_ptr, kv_scales, dtype,
            NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, Q_HEAD_STRIDE: tl.constexpr,
            HAS_NORM: tl.constexpr, WEIGHT_OFFSET: tl.constexpr, SCALES_IN_FLOAT32: tl.constexpr):
    """The row's own key (normed, rotated) and value of `kv_head` as the cache holds them, each [1, HEAD_DIM]."""
    k_scale, v_scale = kv_scales
    one = tl.arange(0, 1)[:, None]  # [1, 1]: one head
    key_row = token_row + NUM_HEADS * Q_HEAD_STRIDE + kv_head * HEAD_DIM + one
    _, _, rot1, rot2 = normed_rotated_halves(key_row, one == 0, one != 0, position, rotary, norm, dtype, HEAD_DIM,
                                             ROTARY_DIM, HAS_NORM, WEIGHT_OFFSET, SCALES_IN_FLOAT32)
    k = cache_value(_whole_heads(rot1, rot2), dtype, k_scale, k_cache_ptr)
    # The values follow all the keys: one head per KV head, as many as the grid's second dimension.
    value_row = key_row + tl.num_programs(1) * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    v = cache_value(tl.load(value_row).to(tl.float32), dtype, v_scale, v_cache_ptr)
    return k, v


@triton.jit
def _fused_decode_split_kernel(
    qkv_ptr,  # [num_rows, >= columns of the heads] queries (between their gates), keys, values
    positions_ptr,  # [num_rows] int64
    cos_ptr,  # [max_position, ROTARY_DIM]
    sin_ptr,
    q_weight_ptr,  # HAS_NORM: [HEAD_DIM] each; else unused
    k_weight_ptr,
    slot_mapping_ptr,  # [num_rows] int64, -1: the own token is not written
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    row_order_ptr,
    sinks_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    qkv_stride,
    eps,
    k_scale,
    v_scale,
    scale_log2,
    softcap_in,
    softcap_out,
    window,
    out_stride_t,
    out_stride_h,
    cache_stride_b,
    cache_stride_s,
    cache_stride_h,
    table_stride_r,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a power of two: the tiles are whole heads
    ROTARY_DIM: tl.constexpr,
    Q_HEAD_STRIDE: tl.constexpr,
    HAS_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    SCALES_IN_FLOAT32: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_ROW_ORDER: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = program_row(row_order_ptr, HAS_ROW_ORDER)
    kv_head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + row)
    first_key, tile_begin, tile_end = segment(context_len, window, BLOCK_N, NUM_SPLITS, HAS_WINDOW)
    holds_own = (tile_begin < tile_end) & (tile_end * BLOCK_N >= context_len)  # the segment of the last tile
    offs_d = tl.arange(0, HEAD_DIM)
    table_row = block_tables_ptr + row * table_stride_r
    positions, is_valid, kv_offsets = tile_offsets(table_row, tile_begin, tile_end, context_len, first_key,
                                                    tl.arange(0, BLOCK_N), offs_d, kv_head, cache_stride_b,
                                                    cache_stride_s, cache_stride_h, BLOCK_SIZE, BLOCK_N, HAS_WINDOW)
    is_own = (is_valid & (positions == context_len - 1))[:, None]
    k_first = load_kv(k_cache_ptr, kv_offsets, is_valid & (positions != context_len - 1), offs_d, HEAD_DIM, HEAD_DIM,
                       False)
    v_first = load_kv(v_cache_ptr, kv_offsets, is_valid & (positions != context_len - 1), offs_d, HEAD_DIM, HEAD_DIM,
                       False)
    # The position and slot come from the host, as the lengths do: read before the wait, so that past it the
    # rotation's tables are read beside qkv rather than one round trip after it.
    position = tl.load(positions_ptr + row)
    slot = tl.load(slot_mapping_ptr + row)
    pdl_start(USE_PDL)

    dtype = out_ptr.dtype.element_ty
    token_row = qkv_ptr + row * qkv_stride
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    is_head = offs_h < GROUP
    rotary = (cos_ptr, sin_ptr)
    norm = (q_weight_ptr, k_weight_ptr, eps)
    _, _, q1, q2 = normed_rotated_halves(token_row + (kv_head * GROUP + offs_h) * Q_HEAD_STRIDE, is_head, is_head,
                                         position, rotary, norm, dtype, HEAD_DIM, ROTARY_DIM, HAS_NORM, WEIGHT_OFFSET,
                                         SCALES_IN_FLOAT32)
    q = tl.where(is_head, _whole_heads(round_to(q1, dtype), round_to(q2, dtype)), 0.0).to(dtype)
    k_own, v_own = _own_kv(token_row, kv_head, position, rotary, norm, k_cache_ptr, v_cache_ptr, (k_scale, v_scale),
                           dtype, NUM_HEADS, HEAD_DIM, ROTARY_DIM, Q_HEAD_STRIDE, HAS_NORM, WEIGHT_OFFSET,
                           SCALES_IN_FLOAT32)
    if holds_own & (slot >= 0):
        own_offsets = ((slot // BLOCK_SIZE) * cache_stride_b + (slot % BLOCK_SIZE) * cache_stride_s
                       + kv_head * cache_stride_h + offs_d[None, :])
        tl.store(k_cache_ptr + own_offsets, k_own)
        tl.store(v_cache_ptr + own_offsets, v_own)
    k_first = tl.where(is_own, k_own, k_first)
    v_first = tl.where(is_own, v_own, v_first)

    acc, m_i, l_i = attend_segment(
        q, (k_first, v_first, is_valid), (k_own, v_own), (tile_begin, tile_end),
        (table_row, context_len, first_key, kv_head), k_cache_ptr, v_cache_ptr,
        (cache_stride_b, cache_stride_s, cache_stride_h), (scale_log2, softcap_in, softcap_out),
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP, True)
    store_segment(acc, m_i, l_i, row, kv_head, sinks_ptr, out_ptr, (out_stride_t, out_stride_h),
                  (partial_out_ptr, partial_lse_ptr), GROUP, HEAD_DIM, NUM_SPLITS, HAS_SINKS)


def fused_decode_attention(
    qkv: torch.Tensor,  # [num_rows, >= columns of the heads], one token per row
    positions: torch.Tensor,  # [num_rows] int64
    layout: QkvHeads,
    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # k_cache, v_cache [blocks, block_size, kv_heads,
    # head_dim], slot_mapping [num_rows] int64 (-1: not written)
    paged: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],  # block_tables, context_lens, row_order (or None)
    scale: float,
    variant: AttentionVariant = PLAIN,
    use_pdl: bool = False,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """What qk_norm_rope_store_kv then decode_attention give (the attention's output [num_rows, num_heads,
    head_dim], the own tokens' K/V in the cache), in one launch (two when the contexts are split); no host sync,
    graph-capturable. The queries are qkv's, its rows the step's tokens, one per row; `scale` is the softmax's (an FP8
    cache's k_scale in it, as for decode_attention; the output is not multiplied by v_scale)."""
    num_heads, num_kv_heads, head_dim = layout.heads
    cos, sin = layout.rotary
    k_cache, v_cache, slot_mapping = kv_cache
    block_tables, context_lens, row_order = paged
    _check_qk(qkv, positions, cos, sin, layout.heads, layout.norm_weights, layout.has_output_gate)
    _check_kv_cache(qkv, layout.heads, kv_cache, layout.has_output_gate)
    out = torch.empty(qkv.shape[0], num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    _check_decode(out, k_cache, v_cache, block_tables, context_lens)
    if qkv.shape[0] == 0:
        return out
    pdl = uses_pdl(use_pdl, qkv)
    launch = SplitLaunch.of(out, k_cache, paged, (scale, variant), (config or DecodeConfig(), pdl))
    q_weight, k_weight = layout.norm_weights if layout.norm_weights is not None else (qkv, qkv)  # unused without
    weight_offset, scales_in_float32 = layout.norm_convention
    _fused_decode_split_kernel[launch.grid](
        qkv_ptr=qkv, positions_ptr=positions, cos_ptr=cos, sin_ptr=sin, q_weight_ptr=q_weight, k_weight_ptr=k_weight,
        slot_mapping_ptr=slot_mapping, k_cache_ptr=k_cache, v_cache_ptr=v_cache, qkv_stride=qkv.stride(0),
        eps=layout.eps, k_scale=layout.kv_scales[0], v_scale=layout.kv_scales[1], NUM_HEADS=num_heads,
        ROTARY_DIM=cos.shape[1], Q_HEAD_STRIDE=(2 if layout.has_output_gate else 1) * head_dim,
        HAS_NORM=layout.norm_weights is not None, WEIGHT_OFFSET=weight_offset, SCALES_IN_FLOAT32=scales_in_float32,
        **launch.arguments,
    )
    launch.merge(out)
    return out
