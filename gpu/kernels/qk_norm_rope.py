"""Triton kernel: per-head RMSNorm (Qwen3's q_norm/k_norm, optional) and rotary embedding of the
queries and keys, read straight from the fused QKV projection.

Queries and keys lie side by side in each row of qkv ([num_heads + num_kv_heads] heads of head_dim,
values after them), so one head index h covers both: h < num_heads is a query head. A program takes
one token and a group of heads, splits each head into its two halves x1, x2 (the rotate-half form:
out1 = x1*cos1 - x2*sin1, out2 = x2*cos2 + x1*sin2) and writes q and k as new contiguous tensors.
The math is float32, rounded to the model dtype at the points where the torch path (gpu/layers/
norm.py, gpu/layers/rotary.py) rounds: after the norm's scaling, after the weight, cos/sin as
model-dtype values, after each product and after the sum. So float32 matches to rounding and
bf16/fp16 almost always to the bit. The launch passes enable_fp_fusion=False: with fusion a product
and the sum are contracted into one FMA that skips the product's rounding, and bf16/fp16 outputs then
differ from the torch path by one unit in the last place.
With Gemma's norm convention (`norm_convention` = (weight offset, True): gpu/layers/norm.py) the normalized
value is scaled by offset + weight in float32 and rounded once, as that torch path does.
A partial rotation (Qwen3-Next's, GLM's: cos/sin tables rotary_dim wide, an even rotary_dim of at most head_dim / 2)
turns the first rotary_dim dims of each head in rotate-half form over rotary_dim, with the same roundings, and
passes the rest through after the norm. With `has_output_gate` each query head in qkv's row is followed by its gate
(Qwen3-Next's, Qwen3.5's q_proj rows, [query; gate] per head): the queries are read from between the gates, which
stay in qkv for the caller to read as a view.
Invariants the wrapper checks: qkv is 2-d with unit stride along its columns and at least
(num_heads (twice that with gates) + num_kv_heads) * head_dim of them; head_dim is a power of two; positions are
int64 [num_tokens]; cos and sin are contiguous [max_position, rotary_dim] in float32 or the model dtype
(a model's .to(dtype) casts these buffers; the kernel rounds them to the model dtype either way);
the norm weights, when given, are [head_dim] in qkv's dtype. Positions are not bounds-checked on
the device (a host check would sync): the caller keeps them below max_position.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import round_to


@triton.jit
def cache_value(x, dtype, scale, cache_ptr):
    """x as the cache stores it: rounded to the model dtype; in an FP8 cache, that divided by the scale in float32
    (as the torch path's store divides), then rounded to FP8."""
    value = round_to(x, dtype)
    if cache_ptr.dtype.element_ty != dtype:
        value = (value.to(tl.float32) / scale).to(cache_ptr.dtype.element_ty)
    return value


@triton.jit
def _rounded(x, dtype):
    """float32 x rounded to the model dtype (round_to: as torch rounds, under the interpreter too) and back."""
    return round_to(x, dtype).to(tl.float32)


@triton.jit
def _normed(x, rstd, weight, dtype, WEIGHT_OFFSET: tl.constexpr, SCALES_IN_FLOAT32: tl.constexpr):
    """x normalized and scaled by its weight, rounded where gpu/layers/norm.py's torch code rounds."""
    if SCALES_IN_FLOAT32:
        return _rounded((x * rstd) * (WEIGHT_OFFSET + weight), dtype)
    return _rounded(weight * _rounded(x * rstd, dtype), dtype)


@triton.jit
def normed_rotated_halves(head_row, is_valid, is_query, position, rotary, norm, dtype, HEAD_DIM: tl.constexpr,
                          ROTARY_DIM: tl.constexpr, HAS_NORM: tl.constexpr, WEIGHT_OFFSET: tl.constexpr,
                          SCALES_IN_FLOAT32: tl.constexpr):
    """Heads read at head_row ([rows, 1] pointers, rows where `is_valid`, zeros elsewhere) and made the attention's:
    (x1, x2, rot1, rot2), their halves [rows, HEAD_DIM // 2] in float32 as read, and normed (queries, where
    `is_query`, by q's weight, the others by k's) then rotated by `position`, each value rounded where the torch path
    rounds. `rotary` is (cos_ptr, sin_ptr), `norm` (q_weight_ptr, k_weight_ptr, eps). One helper for this kernel and
    the decode attention that does the same for its own heads (gpu/kernels/fused_decode_attention.py)."""
    cos_ptr, sin_ptr = rotary
    q_weight_ptr, k_weight_ptr, eps = norm
    half: tl.constexpr = HEAD_DIM // 2
    dims = tl.arange(0, half)[None, :]  # [1, half]
    row = head_row + dims
    x1 = tl.load(row, mask=is_valid, other=0.0).to(tl.float32)
    x2 = tl.load(row + half, mask=is_valid, other=0.0).to(tl.float32)
    out1, out2 = x1, x2
    if HAS_NORM:
        variance = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1))[:, None] / HEAD_DIM
        rstd = tl.math.rsqrt(variance + eps)
        w1 = tl.where(is_query, tl.load(q_weight_ptr + dims), tl.load(k_weight_ptr + dims)).to(tl.float32)
        w2 = tl.where(is_query, tl.load(q_weight_ptr + half + dims), tl.load(k_weight_ptr + half + dims)).to(tl.float32)
        out1 = _normed(x1, rstd, w1, dtype, WEIGHT_OFFSET, SCALES_IN_FLOAT32)
        out2 = _normed(x2, rstd, w2, dtype, WEIGHT_OFFSET, SCALES_IN_FLOAT32)
    if ROTARY_DIM == HEAD_DIM:
        table = position * HEAD_DIM + dims
        cos1 = _rounded(tl.load(cos_ptr + table).to(tl.float32), dtype)
        cos2 = _rounded(tl.load(cos_ptr + table + half).to(tl.float32), dtype)
        sin1 = _rounded(tl.load(sin_ptr + table).to(tl.float32), dtype)
        sin2 = _rounded(tl.load(sin_ptr + table + half).to(tl.float32), dtype)
        # Each product and the sum rounded, as the torch path's q * cos + rotate_half(q) * sin is.
        rot1 = _rounded(out1 * cos1, dtype) + _rounded(-(out2 * sin1), dtype)
        rot2 = _rounded(out2 * cos2, dtype) + _rounded(out1 * sin2, dtype)
    else:
        # A partial rotation turns the first ROTARY_DIM dims (all in the first half) in rotate-half form over
        # ROTARY_DIM: dim d < ROTARY_DIM / 2 pairs with d + ROTARY_DIM / 2 and takes -sin. Each dim's partner is read
        # again and normed as it was (the same rounding, so the same value); the dims past ROTARY_DIM and the
        # second half pass through after the norm.
        rotary_half: tl.constexpr = ROTARY_DIM // 2
        is_turned = dims < ROTARY_DIM
        is_first = dims < rotary_half
        partner = tl.where(is_first, dims + rotary_half, dims - rotary_half)
        x_partner = tl.load(head_row + partner, mask=is_valid & is_turned, other=0.0).to(tl.float32)
        out_partner = x_partner
        if HAS_NORM:
            w_partner = tl.where(is_query, tl.load(q_weight_ptr + partner), tl.load(k_weight_ptr + partner))
            out_partner = _normed(x_partner, rstd, w_partner.to(tl.float32), dtype, WEIGHT_OFFSET, SCALES_IN_FLOAT32)
        table = position * ROTARY_DIM + dims
        cos = _rounded(tl.load(cos_ptr + table, mask=is_turned, other=0.0).to(tl.float32), dtype)
        sin = _rounded(tl.load(sin_ptr + table, mask=is_turned, other=0.0).to(tl.float32), dtype)
        turned_sin = _rounded(out_partner * sin, dtype)  # rounding is symmetric: the sign after it
        turned = _rounded(out1 * cos, dtype) + tl.where(is_first, -turned_sin, turned_sin)
        rot1 = tl.where(is_turned, turned, out1)
        rot2 = out2
    return x1, x2, rot1, rot2


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_weight_ptr,
    k_weight_ptr,
    q_out_ptr,
    k_out_ptr,
    k_cache_ptr,  # STORE_KV: [num_slots, NUM_KV_HEADS, HEAD_DIM] views of the caches; else unused
    v_cache_ptr,
    slot_mapping_ptr,  # STORE_KV: [num_tokens] int64, -1 for a padding token; else unused
    qkv_stride,
    eps,
    k_scale,  # STORE_KV into an FP8 cache: keys and values stored divided by these (1 otherwise)
    v_scale,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,  # HEAD_DIM, or a partial rotation's even width of at most HEAD_DIM / 2
    Q_HEAD_STRIDE: tl.constexpr,  # columns from one query head to the next: HEAD_DIM, or 2 * HEAD_DIM past gates
    BLOCK_H: tl.constexpr,
    HAS_NORM: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    SCALES_IN_FLOAT32: tl.constexpr,
    STORE_KV: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = HEAD_DIM // 2
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    dims = tl.arange(0, half)[None, :]  # [1, half]
    is_query = heads < NUM_HEADS
    is_qk = heads < NUM_HEADS + NUM_KV_HEADS
    if STORE_KV:  # the value heads too, after the keys in qkv's row: copied to the cache as they are
        is_valid = heads < NUM_HEADS + 2 * NUM_KV_HEADS
        slot = tl.load(slot_mapping_ptr + token)
    else:
        is_valid = is_qk
    dtype = q_out_ptr.dtype.element_ty
    if Q_HEAD_STRIDE == HEAD_DIM:
        head_row = qkv_ptr + token * qkv_stride + heads * HEAD_DIM
    else:  # each query followed by its gate: the keys and values start after all the pairs
        head_row = qkv_ptr + token * qkv_stride + tl.where(
            is_query, heads * Q_HEAD_STRIDE, heads * HEAD_DIM + NUM_HEADS * (Q_HEAD_STRIDE - HEAD_DIM))
    position = tl.load(positions_ptr + token)
    x1, x2, rot1, rot2 = normed_rotated_halves(head_row, is_valid, is_query, position, (cos_ptr, sin_ptr),
                                               (q_weight_ptr, k_weight_ptr, eps), dtype, HEAD_DIM, ROTARY_DIM,
                                               HAS_NORM, WEIGHT_OFFSET, SCALES_IN_FLOAT32)
    q_row = q_out_ptr + token * (NUM_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    tl.store(q_row, round_to(rot1, dtype), mask=is_query)
    tl.store(q_row + half, round_to(rot2, dtype), mask=is_query)
    is_key = is_qk & ~is_query
    if STORE_KV:
        # Keys rotated, values as read; a padding token (slot -1) writes nothing.
        kv_head = tl.where(is_key, heads - NUM_HEADS, heads - NUM_HEADS - NUM_KV_HEADS)
        cache_offsets = slot * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims
        is_written = slot + 0 * heads >= 0  # [BLOCK_H, 1]: Triton's interpreter fails on a scalar mask term here
        is_key_written = is_key & is_written
        is_value_written = is_valid & ~is_qk & is_written
        tl.store(k_cache_ptr + cache_offsets, cache_value(rot1, dtype, k_scale, k_cache_ptr), mask=is_key_written)
        tl.store(k_cache_ptr + cache_offsets + half, cache_value(rot2, dtype, k_scale, k_cache_ptr),
                 mask=is_key_written)
        tl.store(v_cache_ptr + cache_offsets, cache_value(x1, dtype, v_scale, v_cache_ptr), mask=is_value_written)
        tl.store(v_cache_ptr + cache_offsets + half, cache_value(x2, dtype, v_scale, v_cache_ptr),
                 mask=is_value_written)
    else:
        k_row = k_out_ptr + token * (NUM_KV_HEADS * HEAD_DIM) + (heads - NUM_HEADS) * HEAD_DIM + dims
        tl.store(k_row, round_to(rot1, dtype), mask=is_key)
        tl.store(k_row + half, round_to(rot2, dtype), mask=is_key)


def qk_norm_rope(
    qkv: torch.Tensor,  # [num_tokens, >= (num_heads + num_kv_heads) * head_dim], queries then keys
    positions: torch.Tensor,  # [num_tokens] int64
    cos: torch.Tensor,  # [max_position, head_dim], float32 or qkv's dtype
    sin: torch.Tensor,  # [max_position, head_dim]
    heads: tuple[int, int, int],  # (num_heads, num_kv_heads, head_dim)
    norm_weights: tuple[torch.Tensor, torch.Tensor] | None = None,  # (q_norm, k_norm), each [head_dim]
    eps: float = 1e-6,
    use_pdl: bool = False,  # a programmatic dependent launch where the GPU has it (gpu/kernels/pdl.py)
    norm_convention: tuple[float, bool] = (0.0, False),  # (weight offset, scales in float32): Llama's by default
    has_output_gate: bool = False,  # qkv's queries are [query; gate] per head: read from between their gates
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim],
    normalized per head when norm weights are given, then rotated by each token's position (the first
    cos.shape[1] dims of each head where that is less than head_dim)."""
    num_heads, num_kv_heads, head_dim = heads
    _check(qkv, positions, cos, sin, heads, norm_weights, has_output_gate)
    q = torch.empty((qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((qkv.shape[0], num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(qkv, positions, (cos, sin), (heads, has_output_gate), (norm_weights, eps, norm_convention), (q, k), None,
            use_pdl)
    return q, k


def qk_norm_rope_store_kv(
    qkv: torch.Tensor,  # [num_tokens, >= (num_heads + 2 * num_kv_heads) * head_dim], queries, keys, values
    positions: torch.Tensor,  # [num_tokens] int64
    rotary: tuple[torch.Tensor, torch.Tensor],  # (cos, sin), each [max_position, head_dim]
    heads: tuple[int, int, int],  # (num_heads, num_kv_heads, head_dim)
    norm_weights: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # k_cache, v_cache [blocks, block_size, kv_heads,
    # head_dim], slot_mapping [num_tokens] int64 (-1: not written)
    use_pdl: bool = False,
    norm_convention: tuple[float, bool] = (0.0, False),
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an FP8 cache's (k_scale, v_scale)
    has_output_gate: bool = False,
) -> torch.Tensor:
    """As qk_norm_rope, but the rotated keys and the values go straight to their cache slots (as store_kv
    would write them, gpu/kernels/store_kv.py) instead of a returned k: one kernel instead of two. An FP8 cache
    (float8_e4m3fn) gets fp8(key / k_scale) and fp8(value / v_scale). Returns q [num_tokens, num_heads, head_dim]."""
    num_heads, num_kv_heads, head_dim = heads
    cos, sin = rotary
    _check(qkv, positions, cos, sin, heads, norm_weights, has_output_gate)
    _check_kv_cache(qkv, heads, kv_cache, has_output_gate)
    q = torch.empty((qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(qkv, positions, rotary, (heads, has_output_gate), (norm_weights, eps, norm_convention), (q, q),
            (*kv_cache, kv_scales), use_pdl)
    return q


def _launch(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    layout: tuple[tuple[int, int, int], bool],  # heads, whether each query is followed by its gate
    norms: tuple[tuple[torch.Tensor, torch.Tensor] | None, float, tuple[float, bool]],  # weights, eps, convention
    outputs: tuple[torch.Tensor, torch.Tensor],  # q, k (k unused when kv_cache is given)
    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float]] | None,  # with the scales
    use_pdl: bool,
) -> None:
    (num_heads, num_kv_heads, head_dim), has_output_gate = layout
    norm_weights, eps, (weight_offset, scales_in_float32) = norms
    num_tokens = qkv.shape[0]
    if num_tokens == 0:
        return
    total_heads = num_heads + (2 if kv_cache is not None else 1) * num_kv_heads
    # About 1024 elements per program: whole heads, enough work per program for a prefill's many
    # tokens, and a few programs per token so a batch-1 decode still spreads over several SMs.
    block_h = min(triton.next_power_of_2(total_heads), max(1024 // head_dim, 1))
    q_weight, k_weight = norm_weights if norm_weights is not None else (qkv, qkv)  # unused without a norm
    k_cache, v_cache, slot_mapping, (k_scale, v_scale) = (kv_cache if kv_cache is not None  # else unused
                                                          else (qkv, qkv, positions, (1.0, 1.0)))
    _qk_norm_rope_kernel[(num_tokens, triton.cdiv(total_heads, block_h))](
        qkv, positions, *rotary, q_weight, k_weight, *outputs, k_cache, v_cache, slot_mapping, qkv.stride(0), eps,
        k_scale, v_scale,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        ROTARY_DIM=rotary[0].shape[1],
        Q_HEAD_STRIDE=(2 if has_output_gate else 1) * head_dim,
        BLOCK_H=block_h,
        HAS_NORM=norm_weights is not None,
        WEIGHT_OFFSET=weight_offset,
        SCALES_IN_FLOAT32=scales_in_float32,
        STORE_KV=kv_cache is not None,
        USE_PDL=uses_pdl(use_pdl, qkv),
        launch_pdl=uses_pdl(use_pdl, qkv),
        num_warps=4 if block_h * head_dim >= 1024 else 2,
        enable_fp_fusion=False,  # no mul+add into one FMA: torch rounds the product first
    )


def _check_kv_cache(
    qkv: torch.Tensor, heads: tuple[int, int, int], kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    has_output_gate: bool,
) -> None:
    num_heads, num_kv_heads, head_dim = heads
    k_cache, v_cache, slot_mapping = kv_cache
    width = ((2 if has_output_gate else 1) * num_heads + 2 * num_kv_heads) * head_dim
    if qkv.shape[1] < width:
        raise ValueError(f"qkv must hold the values too: >= {width} columns, got {qkv.shape[1]}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"caches must be alike [blocks, block_size, {num_kv_heads}, {head_dim}], got "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if k_cache.dtype not in (qkv.dtype, torch.float8_e4m3fn) or v_cache.dtype != k_cache.dtype or not (
            k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"caches must be contiguous {qkv.dtype} or float8_e4m3fn, got {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if slot_mapping.shape != (qkv.shape[0],) or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64 [{qkv.shape[0]}], got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")


def _check(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: tuple[int, int, int],
    norm_weights: tuple[torch.Tensor, torch.Tensor] | None,
    has_output_gate: bool,
) -> None:
    num_heads, num_kv_heads, head_dim = heads
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 2, got {head_dim}")
    width = ((2 if has_output_gate else 1) * num_heads + num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] < width:
        raise ValueError(f"qkv must be 2-d with unit column stride and >= {width} columns, got {tuple(qkv.shape)} "
                         f"strides {qkv.stride()}")
    if positions.shape != (qkv.shape[0],) or positions.dtype != torch.int64:
        raise ValueError(f"positions must be int64 [{qkv.shape[0]}], got {positions.dtype} {tuple(positions.shape)}")
    if cos.shape != sin.shape or cos.dtype != sin.dtype or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos and sin must be alike and contiguous, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    rotary_dim = cos.shape[1] if cos.dim() == 2 else 0  # a partial rotation's lies within the first half of a head
    is_rotary_dim = rotary_dim == head_dim or (rotary_dim % 2 == 0 and 2 <= rotary_dim <= head_dim // 2)
    if not is_rotary_dim or cos.dtype not in (torch.float32, qkv.dtype):
        raise ValueError(f"cos and sin must be [max_position, {head_dim} or an even width <= {head_dim // 2}] in "
                         f"float32 or {qkv.dtype}, got {cos.dtype} {tuple(cos.shape)}")
    for weight in norm_weights or ():
        if weight.shape != (head_dim,) or weight.dtype != qkv.dtype or not weight.is_contiguous():
            raise ValueError(f"norm weights must be contiguous [{head_dim}] {qkv.dtype}, got {weight.dtype} "
                             f"{tuple(weight.shape)}")
