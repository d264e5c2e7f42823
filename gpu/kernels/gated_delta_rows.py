"""Triton kernel: the gated delta rule (gpu/layers/gated_delta_rule.py) over each row's tokens one after another in
one launch, for steps whose rows are short: a few sequential tokens cost less than the host time of a chunked
kernel's many launches. It generalizes gpu/kernels/gated_delta_decode.py's one token to a row's tokens.

Per row r, value head h (key head h // (Hv / Hk)) and block of value columns, in float32:
    S = keeps[r] * state[slot[r], h]                    (keeps 0: the row starts its sequence, S from zeros)
    for each piece of the row, for each token t of it:
        q, k = l2_normalized(q_t), l2_normalized(k_t);  q *= key_dim ** -0.5
        S = S * exp(g[t, h]);  S += k (beta[t, h] (v_t - S^T k))^T;  out[t, h] = S^T q
    after each piece: state[piece's state row, h] = S
A row's pieces end where its state is saved (gpu/attention/metadata.py's SequentialRows): a snapshot row after each
inner cut, the row's own slot after its last piece, so one launch serves any number of snapshots. Grid: (row, value
head, block of value columns); each program keeps its [key_dim, BLOCK_V] part of the state in registers across the
row. A row with no token (a padding row of gpu/mixed_graphs.py's padded steps: one empty piece) does nothing, so a
padded step's grid may hold many. Invariants the wrapper checks: q, k, v are column slices of one [tokens, *] tensor
with unit column stride; the state is contiguous [state rows, Hv, key_dim, value_dim] float32; the index tensors are
int64.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.gated_delta_decode import check_inputs, delta_step, token_inputs


@triton.jit
def _gated_delta_rows_kernel(
    qkv_ptr, qkv_stride, g_ptr, beta_ptr, state_ptr, slots_ptr, keeps_ptr, out_ptr, row_starts_ptr,
    row_pieces_ptr, piece_ends_ptr, piece_states_ptr,
    NUM_VALUE_HEADS: tl.constexpr, VALUE_HEADS_PER_KEY_HEAD: tl.constexpr, KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr, K_OFFSET: tl.constexpr, V_OFFSET: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr, SCALE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    columns = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    keys = tl.arange(0, BLOCK_K)
    key_mask, column_mask = keys < KEY_DIM, columns < VALUE_DIM
    state_mask = key_mask[:, None] & column_mask[None, :]
    head_offsets = (head * KEY_DIM + keys[:, None]) * VALUE_DIM + columns[None, :]  # within a state row
    key_offset = (head // VALUE_HEADS_PER_KEY_HEAD) * KEY_DIM
    # One flat loop over the row's tokens (a piece's end only stores the state): the next token's inputs are loaded
    # while this one's are used, so their latency hides behind the dependent chain of state updates.
    piece = tl.load(row_pieces_ptr + row)
    last_piece = tl.load(row_pieces_ptr + row + 1)
    start = tl.load(row_starts_ptr + row)
    piece_end = tl.load(piece_ends_ptr + piece)  # a row has at least one piece, and each piece a token
    row_end = tl.load(piece_ends_ptr + last_piece - 1)
    if start < row_end:  # else a padding row of a padded step (gpu/mixed_graphs.py): one empty piece, nothing to do
        _row(qkv_ptr, qkv_stride, g_ptr, beta_ptr, state_ptr, slots_ptr, keeps_ptr, out_ptr, piece_ends_ptr,
             piece_states_ptr, row, head, columns, keys, key_mask, column_mask, state_mask, head_offsets, key_offset,
             piece, last_piece, start, piece_end, row_end, NUM_VALUE_HEADS, KEY_DIM, VALUE_DIM, K_OFFSET, V_OFFSET,
             SCALE)


@triton.jit
def _row(qkv_ptr, qkv_stride, g_ptr, beta_ptr, state_ptr, slots_ptr, keeps_ptr, out_ptr, piece_ends_ptr,
         piece_states_ptr, row, head, columns, keys, key_mask, column_mask, state_mask, head_offsets, key_offset,
         piece, last_piece, start, piece_end, row_end, NUM_VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr,
         VALUE_DIM: tl.constexpr, K_OFFSET: tl.constexpr, V_OFFSET: tl.constexpr, SCALE: tl.constexpr):
    """A row's tokens [start, row_end) from its slot's state, the state stored after each piece."""
    slot = tl.load(slots_ptr + row)
    keeps = tl.load(keeps_ptr + row)
    state = tl.load(state_ptr + slot * NUM_VALUE_HEADS * KEY_DIM * VALUE_DIM + head_offsets, mask=state_mask,
                    other=0.0) * keeps
    q, k, v, g, beta = token_inputs(qkv_ptr, qkv_stride, g_ptr, beta_ptr, start, keys, key_mask, columns,
                                     column_mask, head, key_offset, NUM_VALUE_HEADS, K_OFFSET, V_OFFSET, VALUE_DIM)
    for t in range(start, row_end):
        # The next token's (the last token's again at the row's end, unused): loads stay within the row.
        next_q, next_k, next_v, next_g, next_beta = token_inputs(
            qkv_ptr, qkv_stride, g_ptr, beta_ptr, tl.minimum(t + 1, row_end - 1), keys, key_mask, columns,
            column_mask, head, key_offset, NUM_VALUE_HEADS, K_OFFSET, V_OFFSET, VALUE_DIM)
        state, out = delta_step(state, q, k, v, g, beta, SCALE)
        tl.store(out_ptr + (t * NUM_VALUE_HEADS + head) * VALUE_DIM + columns, out, mask=column_mask)
        if t + 1 == piece_end:
            destination = tl.load(piece_states_ptr + piece)
            tl.store(state_ptr + destination * NUM_VALUE_HEADS * KEY_DIM * VALUE_DIM + head_offsets, state,
                     mask=state_mask)
            piece = tl.minimum(piece + 1, last_piece - 1)  # past the last piece: its end again, never reached
            piece_end = tl.load(piece_ends_ptr + piece)
        q, k, v, g, beta = next_q, next_k, next_v, next_g, next_beta


def gated_delta_rows(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """qkv [tokens, 2 Hk dk + Hv dv] (q, k, v after the convolution, rows packed one after another), heads
    (Hk, Hv, dk, dv), g [tokens, Hv] float32, beta [tokens, Hv], state [state rows, Hv, dk, dv] float32 (read at the
    rows' slots, written at their pieces' state rows, in place); `rows` = (slots [rows], keeps [rows] float32,
    row_starts [rows], row_pieces [rows + 1] (each row's pieces, cumulative), piece_ends [pieces] (a piece's end
    among the step's tokens), piece_states [pieces] (the state row its state is stored to)). Returns the output
    [tokens, Hv, dv] float32."""
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    num_tokens = qkv.shape[0]
    check_inputs(qkv, heads, g, beta, state)
    slots, keeps, row_starts, row_pieces, piece_ends, piece_states = rows
    num_rows = slots.shape[0]
    if keeps.dtype != torch.float32 or any(x.dtype != torch.int64 for x in (slots, row_starts, row_pieces, piece_ends,
                                                                             piece_states)):
        raise ValueError("the rows' keeps must be float32 and their indices int64")
    if keeps.shape != (num_rows,) or row_starts.shape != (num_rows,) or row_pieces.shape != (num_rows + 1,) or \
            piece_ends.shape != piece_states.shape:
        raise ValueError(f"{num_rows} rows need [rows] keeps and starts, [rows + 1] piece counts and equal pieces' "
                         f"ends and states, got {tuple(keeps.shape)}, {tuple(row_starts.shape)}, "
                         f"{tuple(row_pieces.shape)}, {tuple(piece_ends.shape)}, {tuple(piece_states.shape)}")
    out = torch.empty(num_tokens, num_value_heads, value_dim, dtype=torch.float32, device=qkv.device)
    if num_rows == 0:
        return out
    # Narrow column blocks of one warp each (as flash-linear-attention's recurrent kernel): a row's tokens are a chain
    # of dependent steps, so many small programs hide each other's latency and reduce within a warp, never across.
    block_v = min(triton.next_power_of_2(value_dim), 8)
    grid = (num_rows, num_value_heads, triton.cdiv(value_dim, block_v))
    _gated_delta_rows_kernel[grid](
        qkv, qkv.stride(0), g, beta, state, slots, keeps, out, row_starts, row_pieces, piece_ends, piece_states,
        NUM_VALUE_HEADS=num_value_heads, VALUE_HEADS_PER_KEY_HEAD=num_value_heads // num_key_heads, KEY_DIM=key_dim,
        VALUE_DIM=value_dim, K_OFFSET=num_key_heads * key_dim, V_OFFSET=2 * num_key_heads * key_dim,
        BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=block_v, SCALE=key_dim**-0.5, num_warps=1, num_stages=1,
    )
    return out
