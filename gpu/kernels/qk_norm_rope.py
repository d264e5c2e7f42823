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
Invariants the wrapper checks: qkv is 2-d with unit stride along its columns and at least
(num_heads + num_kv_heads) * head_dim of them; head_dim is a power of two; positions are int64
[num_tokens]; cos and sin are contiguous [max_position, head_dim] in float32 or the model dtype
(a model's .to(dtype) casts these buffers; the kernel rounds them to the model dtype either way);
the norm weights, when given, are [head_dim] in qkv's dtype. Positions are not bounds-checked on
the device (a host check would sync): the caller keeps them below max_position.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl


@triton.jit
def _cache_value(x, dtype, scale, cache_ptr):
    """x as the cache stores it: rounded to the model dtype; in an FP8 cache, that divided by the scale in float32
    (as the torch path's store divides), then rounded to FP8."""
    value = x.to(dtype)
    if cache_ptr.dtype.element_ty != dtype:
        value = (value.to(tl.float32) / scale).to(cache_ptr.dtype.element_ty)
    return value


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
    row = qkv_ptr + token * qkv_stride + heads * HEAD_DIM + dims
    x1 = tl.load(row, mask=is_valid, other=0.0).to(tl.float32)
    x2 = tl.load(row + half, mask=is_valid, other=0.0).to(tl.float32)
    out1, out2 = x1, x2
    if HAS_NORM:
        variance = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1))[:, None] / HEAD_DIM
        rstd = tl.math.rsqrt(variance + eps)
        w1 = tl.where(is_query, tl.load(q_weight_ptr + dims), tl.load(k_weight_ptr + dims)).to(tl.float32)
        w2 = tl.where(is_query, tl.load(q_weight_ptr + half + dims), tl.load(k_weight_ptr + half + dims)).to(tl.float32)
        if SCALES_IN_FLOAT32:
            out1 = ((x1 * rstd) * (WEIGHT_OFFSET + w1)).to(dtype).to(tl.float32)
            out2 = ((x2 * rstd) * (WEIGHT_OFFSET + w2)).to(dtype).to(tl.float32)
        else:
            out1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
            out2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    position = tl.load(positions_ptr + token)
    table = position * HEAD_DIM + dims
    cos1 = tl.load(cos_ptr + table).to(dtype).to(tl.float32)
    cos2 = tl.load(cos_ptr + table + half).to(dtype).to(tl.float32)
    sin1 = tl.load(sin_ptr + table).to(dtype).to(tl.float32)
    sin2 = tl.load(sin_ptr + table + half).to(dtype).to(tl.float32)
    # Each product and the sum rounded, as the torch path's q * cos + rotate_half(q) * sin is.
    rot1 = (out1 * cos1).to(dtype).to(tl.float32) + (-(out2 * sin1)).to(dtype).to(tl.float32)
    rot2 = (out2 * cos2).to(dtype).to(tl.float32) + (out1 * sin2).to(dtype).to(tl.float32)
    q_row = q_out_ptr + token * (NUM_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    tl.store(q_row, rot1.to(dtype), mask=is_query)
    tl.store(q_row + half, rot2.to(dtype), mask=is_query)
    is_key = is_qk & ~is_query
    if STORE_KV:
        # Keys rotated, values as read; a padding token (slot -1) writes nothing.
        kv_head = tl.where(is_key, heads - NUM_HEADS, heads - NUM_HEADS - NUM_KV_HEADS)
        cache_offsets = slot * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims
        is_written = slot + 0 * heads >= 0  # [BLOCK_H, 1]: Triton's interpreter fails on a scalar mask term here
        is_key_written = is_key & is_written
        is_value_written = is_valid & ~is_qk & is_written
        tl.store(k_cache_ptr + cache_offsets, _cache_value(rot1, dtype, k_scale, k_cache_ptr), mask=is_key_written)
        tl.store(k_cache_ptr + cache_offsets + half, _cache_value(rot2, dtype, k_scale, k_cache_ptr),
                 mask=is_key_written)
        tl.store(v_cache_ptr + cache_offsets, _cache_value(x1, dtype, v_scale, v_cache_ptr), mask=is_value_written)
        tl.store(v_cache_ptr + cache_offsets + half, _cache_value(x2, dtype, v_scale, v_cache_ptr),
                 mask=is_value_written)
    else:
        k_row = k_out_ptr + token * (NUM_KV_HEADS * HEAD_DIM) + (heads - NUM_HEADS) * HEAD_DIM + dims
        tl.store(k_row, rot1.to(dtype), mask=is_key)
        tl.store(k_row + half, rot2.to(dtype), mask=is_key)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim],
    normalized per head when norm weights are given, then rotated by each token's position."""
    num_heads, num_kv_heads, head_dim = heads
    _check(qkv, positions, cos, sin, heads, norm_weights)
    q = torch.empty((qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((qkv.shape[0], num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(qkv, positions, (cos, sin), heads, (norm_weights, eps, norm_convention), (q, k), None, use_pdl)
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
) -> torch.Tensor:
    """As qk_norm_rope, but the rotated keys and the values go straight to their cache slots (as store_kv
    would write them, gpu/kernels/store_kv.py) instead of a returned k: one kernel instead of two. An FP8 cache
    (float8_e4m3fn) gets fp8(key / k_scale) and fp8(value / v_scale). Returns q [num_tokens, num_heads, head_dim]."""
    num_heads, num_kv_heads, head_dim = heads
    cos, sin = rotary
    _check(qkv, positions, cos, sin, heads, norm_weights)
    _check_kv_cache(qkv, heads, kv_cache)
    q = torch.empty((qkv.shape[0], num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(qkv, positions, rotary, heads, (norm_weights, eps, norm_convention), (q, q), (*kv_cache, kv_scales),
            use_pdl)
    return q


def _launch(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    heads: tuple[int, int, int],
    norms: tuple[tuple[torch.Tensor, torch.Tensor] | None, float, tuple[float, bool]],  # weights, eps, convention
    outputs: tuple[torch.Tensor, torch.Tensor],  # q, k (k unused when kv_cache is given)
    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float]] | None,  # with the scales
    use_pdl: bool,
) -> None:
    num_heads, num_kv_heads, head_dim = heads
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
    qkv: torch.Tensor, heads: tuple[int, int, int], kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> None:
    num_heads, num_kv_heads, head_dim = heads
    k_cache, v_cache, slot_mapping = kv_cache
    if qkv.shape[1] < (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv must hold the values too: >= {(num_heads + 2 * num_kv_heads) * head_dim} columns, "
                         f"got {qkv.shape[1]}")
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
) -> None:
    num_heads, num_kv_heads, head_dim = heads
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 2, got {head_dim}")
    width = (num_heads + num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] < width:
        raise ValueError(f"qkv must be 2-d with unit column stride and >= {width} columns, got {tuple(qkv.shape)} "
                         f"strides {qkv.stride()}")
    if positions.shape != (qkv.shape[0],) or positions.dtype != torch.int64:
        raise ValueError(f"positions must be int64 [{qkv.shape[0]}], got {positions.dtype} {tuple(positions.shape)}")
    if cos.shape != sin.shape or cos.dtype != sin.dtype or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos and sin must be alike and contiguous, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if cos.dim() != 2 or cos.shape[1] != head_dim or cos.dtype not in (torch.float32, qkv.dtype):
        raise ValueError(f"cos and sin must be [max_position, {head_dim}] in float32 or {qkv.dtype}, got "
                         f"{cos.dtype} {tuple(cos.shape)}")
    for weight in norm_weights or ():
        if weight.shape != (head_dim,) or weight.dtype != qkv.dtype or not weight.is_contiguous():
            raise ValueError(f"norm weights must be contiguous [{head_dim}] {qkv.dtype}, got {weight.dtype} "
                             f"{tuple(weight.shape)}")
