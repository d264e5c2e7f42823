"""Triton kernel: one decode step of the gated delta rule (gpu/layers/gated_delta_rule.py's `recurrent`), each row's
recurrent state read from and written back to its slot of the state cache in place.

Per row r, value head h (key head h // (Hv / Hk)) and block of value columns:
    q, k = l2_normalized(q), l2_normalized(k);  q *= key_dim ** -0.5
    S = keeps[r] * state[slot[r], h] * exp(g[r, h])      (keeps 0: the row starts its sequence, S from zeros)
    S += k (beta[r, h] (v - S^T k))^T;  out[r, h] = S^T q;  state[slot[r], h] = S
in float32. Grid: (row, value head, block of value columns); each program holds its [key_dim, BLOCK_V] part of the
state, so the rows' states are never gathered into a copy. Invariants the wrapper checks: q, k, v are column slices
of one [rows, *] tensor with unit column stride; the state is contiguous [slots, Hv, key_dim, value_dim] float32.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_delta_decode_kernel(
    qkv_ptr, qkv_stride, g_ptr, beta_ptr, state_ptr, slots_ptr, keeps_ptr, out_ptr,
    NUM_VALUE_HEADS: tl.constexpr, VALUE_HEADS_PER_KEY_HEAD: tl.constexpr, KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr, K_OFFSET: tl.constexpr, V_OFFSET: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr, SCALE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    columns = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    keys = tl.arange(0, BLOCK_K)
    key_mask, column_mask = keys < KEY_DIM, columns < VALUE_DIM
    q, k, v, g, beta = token_inputs(qkv_ptr, qkv_stride, g_ptr, beta_ptr, row, keys, key_mask, columns, column_mask,
                                    head, (head // VALUE_HEADS_PER_KEY_HEAD) * KEY_DIM, NUM_VALUE_HEADS, K_OFFSET,
                                    V_OFFSET, VALUE_DIM)
    keeps = tl.load(keeps_ptr + row)
    slot = tl.load(slots_ptr + row)
    state_offsets = ((slot * NUM_VALUE_HEADS + head) * KEY_DIM + keys[:, None]) * VALUE_DIM + columns[None, :]
    state_mask = key_mask[:, None] & column_mask[None, :]
    state = tl.load(state_ptr + state_offsets, mask=state_mask, other=0.0) * keeps
    state, out = delta_step(state, q, k, v, g, beta, SCALE)
    tl.store(state_ptr + state_offsets, state, mask=state_mask)
    tl.store(out_ptr + (row * NUM_VALUE_HEADS + head) * VALUE_DIM + columns, out, mask=column_mask)


@triton.jit
def token_inputs(qkv_ptr, qkv_stride, g_ptr, beta_ptr, t, keys, key_mask, columns, column_mask, head, key_offset,
                 NUM_VALUE_HEADS: tl.constexpr, K_OFFSET: tl.constexpr, V_OFFSET: tl.constexpr,
                 VALUE_DIM: tl.constexpr):
    """Token t's q, k (the head's key head, at `key_offset`), v (the program's columns), g and beta in float32 (this
    kernel's and gpu/kernels/gated_delta_rows.py's)."""
    base = qkv_ptr + t.to(tl.int64) * qkv_stride
    q = tl.load(base + key_offset + keys, mask=key_mask, other=0.0).to(tl.float32)
    k = tl.load(base + K_OFFSET + key_offset + keys, mask=key_mask, other=0.0).to(tl.float32)
    v = tl.load(base + V_OFFSET + head * VALUE_DIM + columns, mask=column_mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + t * NUM_VALUE_HEADS + head).to(tl.float32)
    beta = tl.load(beta_ptr + t * NUM_VALUE_HEADS + head).to(tl.float32)
    return q, k, v, g, beta


@triton.jit
def delta_step(state, q, k, v, g, beta, SCALE: tl.constexpr):
    """One token of the rule on a program's [key_dim, BLOCK_V] part of the state: (the new state, the token's output
    columns)."""
    q = q / tl.sqrt(tl.sum(q * q) + 1e-6) * SCALE
    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    state = state * tl.exp(g)
    predicted = tl.sum(state * k[:, None], axis=0)  # [BLOCK_V]
    state = state + k[:, None] * ((v - predicted) * beta)[None, :]
    return state, tl.sum(state * q[:, None], axis=0)


def gated_delta_decode(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, slots: torch.Tensor, keeps: torch.Tensor) -> torch.Tensor:
    """qkv [rows, 2 Hk dk + Hv dv] (q, k, v after the convolution), heads (Hk, Hv, dk, dv), g [rows, Hv] float32,
    beta [rows, Hv], state [slots, Hv, dk, dv] float32 (updated in place), slots [rows] int64, keeps [rows] float32.
    Returns the output [rows, Hv, dv] float32."""
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    rows = qkv.shape[0]
    check_inputs(qkv, heads, g, beta, state)
    out = torch.empty(rows, num_value_heads, value_dim, dtype=torch.float32, device=qkv.device)
    if rows == 0:
        return out
    block_v = min(triton.next_power_of_2(value_dim), 32)
    grid = (rows, num_value_heads, triton.cdiv(value_dim, block_v))
    _gated_delta_decode_kernel[grid](
        qkv, qkv.stride(0), g, beta, state, slots.contiguous(), keeps.contiguous(), out,
        NUM_VALUE_HEADS=num_value_heads, VALUE_HEADS_PER_KEY_HEAD=num_value_heads // num_key_heads, KEY_DIM=key_dim,
        VALUE_DIM=value_dim, K_OFFSET=num_key_heads * key_dim, V_OFFSET=2 * num_key_heads * key_dim,
        BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=block_v, SCALE=key_dim**-0.5,
    )
    return out


def check_inputs(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor) -> None:
    """What both delta-rule kernels (this one and gpu/kernels/gated_delta_rows.py) assume of their inputs: qkv
    [tokens, 2 Hk dk + Hv dv] with unit column stride, state contiguous float32 [*, Hv, dk, dv], Hv a multiple of Hk,
    g and beta contiguous [tokens, Hv]."""
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    num_tokens = qkv.shape[0]
    width = 2 * num_key_heads * key_dim + num_value_heads * value_dim
    if qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] != width:
        raise ValueError(f"qkv must be [tokens, q + k + v] with unit column stride, got {tuple(qkv.shape)} "
                         f"strides {qkv.stride()}")
    if state.dtype != torch.float32 or not state.is_contiguous() or state.shape[1:] != (num_value_heads, key_dim,
                                                                                          value_dim):
        raise ValueError(f"state must be contiguous float32 [rows, {num_value_heads}, {key_dim}, {value_dim}], got "
                         f"{state.dtype} {tuple(state.shape)}")
    if num_value_heads % num_key_heads:
        raise ValueError(f"{num_value_heads} value heads cannot share {num_key_heads} key heads")
    for name, tensor in (("g", g), ("beta", beta)):
        if tensor.shape != (num_tokens, num_value_heads) or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{num_tokens}, {num_value_heads}], got {tuple(tensor.shape)}")
