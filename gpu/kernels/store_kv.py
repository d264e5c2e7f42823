"""Triton kernel: write one step's new keys and values into their paged-cache slots.

One program per token copies that token's K and V rows ([num_kv_heads, head_dim] each) to slot
s = block * block_size + offset of the caches viewed as [num_slots, num_kv_heads, head_dim].
Slot -1 marks a padding token: its loads and stores are masked off, so nothing is written.
Invariants the wrapper checks: key and value have unit stride along head_dim (any token and head
strides, so views of the fused QKV output need no copy), both caches are contiguous and alike,
slot_mapping is int64 with one entry per token.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    # A masked-off padding token issues no memory traffic at all.
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM) & (slot >= 0)
    key = tl.load(key_ptr + token * key_stride_t + heads * key_stride_h + dims, mask=mask)
    value = tl.load(value_ptr + token * value_stride_t + heads * value_stride_h + dims, mask=mask)
    cache_offsets = slot * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    tl.store(k_cache_ptr + cache_offsets, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_offsets, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 skipped
) -> None:
    """Write key[t], value[t] to cache slot slot_mapping[t] for every token whose slot is not -1."""
    num_tokens, num_kv_heads, head_dim = key.shape
    _check(key, value, k_cache, v_cache, slot_mapping)
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )


def _check(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    if key.dim() != 3 or key.shape != value.shape:
        shapes = f"{tuple(key.shape)}, {tuple(value.shape)}"
        raise ValueError(f"key and value must be alike [num_tokens, num_kv_heads, head_dim], got {shapes}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must be alike 4-d tensors, got {k_cache.shape}, {v_cache.shape}")
    if tuple(k_cache.shape[2:]) != tuple(key.shape[1:]):
        raise ValueError(f"cache heads/head_dim {tuple(k_cache.shape[2:])} differ from key's {tuple(key.shape[1:])}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    if key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("key and value need unit stride along head_dim")
    if slot_mapping.shape != (key.shape[0],) or slot_mapping.dtype != torch.int64:
        got = f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        raise ValueError(f"slot_mapping must be int64 [{key.shape[0]}], got {got}")
