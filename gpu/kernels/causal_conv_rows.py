"""Triton kernel: the Gated DeltaNet's causal depthwise convolution and SiLU over a step's prompt rows in one launch,
with their conv states read and written in place (the torch path, gpu/layers/gated_delta_rule.py's `conv_packed`
over gathered windows, is the reference and the CPU path).

Per row r (its tokens [start, end) among the step's, packed one after another), channel c, token t of the row:
    input(p) = x[p, c]                                  p >= start (the row's own tokens)
             = keeps[r] ? state[slot[r], c, p - start + K - 1] : 0     start - (K - 1) <= p < start
    out[t, c] = round(silu(round(sum_j weight[c, j] * input(t - (K - 1) + j))))   float32 sums, rounded as torch
and after each of the row's pieces (gpu/attention/metadata.py's SequentialRows: a piece ends where a snapshot is
saved, the last one at the row's end), state[piece's state row, c, :] = input(end - (K - 1) ... end - 1): a snapshot
row after each inner cut, the row's own slot after its last piece. So a row shorter than K - 1 keeps part of the
state it read.

A padding row of gpu/mixed_graphs.py's padded steps has one empty piece at token 0 and starts its state: it writes no
output and stores zeros to its state row (the padding row of the state cache).
Grid: (row, block of channels, block of the row's tokens; a block past the row's tokens skips the convolution). The
row's first token block alone writes its states: it is the only program that reads the row's slot (a later block's
windows lie inside the row, since a token block is at least K - 1 long), and it synchronizes its threads before
storing the slot, so every read of it comes first.
Invariants the wrapper checks: x [tokens, channels] with unit column stride (a column slice of the projection),
weight [channels, K] and state [state rows, channels, K - 1] with unit stride along K, one dtype for all three; the
index tensors int64, keeps float32.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import exp, round_to

BLOCK_CHANNELS = 256
BLOCK_TOKENS = 16


@triton.jit
def _inputs(x_ptr, x_stride, slot_state_ptr, state_channel_stride, positions, channels, mask, start, state_start,
            KERNEL_SIZE: tl.constexpr):
    """The inputs at `positions` [P] of `channels` [C]: the row's tokens from `start` on, its initial conv state
    from `state_start` (start - (K - 1), or start where the row starts its sequence: zeros before it): [P, C] in the
    inputs' dtype."""
    is_token = positions >= start
    token_offsets = positions[:, None].to(tl.int64) * x_stride + channels[None, :]
    tokens = tl.load(x_ptr + token_offsets, mask=mask & is_token[:, None], other=0.0)
    is_state = (positions >= state_start) & (positions < start)
    state_offsets = channels[None, :] * state_channel_stride + (positions - start + KERNEL_SIZE - 1)[:, None]
    state = tl.load(slot_state_ptr + state_offsets, mask=mask & is_state[:, None], other=0.0)
    return tl.where(is_token[:, None], tokens, state)


@triton.jit
def _causal_conv_rows_kernel(
    x_ptr, x_stride, weight_ptr, weight_stride, state_ptr, state_row_stride, state_channel_stride, out_ptr,
    slots_ptr, keeps_ptr, row_starts_ptr, row_pieces_ptr, piece_ends_ptr, piece_states_ptr,
    CHANNELS: tl.constexpr, KERNEL_SIZE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    row = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_mask = channels < CHANNELS
    token_block = tl.program_id(2)
    start = tl.load(row_starts_ptr + row)
    first_piece = tl.load(row_pieces_ptr + row)
    last_piece = tl.load(row_pieces_ptr + row + 1) - 1
    end = tl.load(piece_ends_ptr + last_piece)
    slot = tl.load(slots_ptr + row)
    state_start = start - (KERNEL_SIZE - 1) * (tl.load(keeps_ptr + row) != 0.0).to(tl.int64)
    slot_state_ptr = state_ptr + slot * state_row_stride
    dtype = out_ptr.dtype.element_ty

    tokens = start + token_block * BLOCK_T + tl.arange(0, BLOCK_T)
    # A block past the row's tokens skips the convolution: the grid's token blocks are the longest row's (or, padded
    # to a bucket, the bucket's), so most programs of a padded step's rows have none.
    if start + token_block * BLOCK_T < end:
        mask = (tokens < end)[:, None] & channel_mask[None, :]
        total = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
        for j in tl.static_range(KERNEL_SIZE):
            weight = tl.load(weight_ptr + channels * weight_stride + j, mask=channel_mask, other=0.0).to(tl.float32)
            inputs = _inputs(x_ptr, x_stride, slot_state_ptr, state_channel_stride, tokens - (KERNEL_SIZE - 1 - j),
                             channels, mask, start, state_start, KERNEL_SIZE)
            total += inputs.to(tl.float32) * weight[None, :]
        convolved = round_to(total, dtype).to(tl.float32)
        silu = tl.math.div_rn(convolved, 1.0 + exp(-convolved))
        tl.store(out_ptr + tokens[:, None].to(tl.int64) * CHANNELS + channels[None, :], round_to(silu, dtype),
                 mask=mask)

    if token_block == 0:
        window = tl.arange(0, BLOCK_W)
        window_mask = (window < KERNEL_SIZE - 1)[:, None] & channel_mask[None, :]
        state_offsets = channels[None, :] * state_channel_stride + window[:, None]
        for piece in range(first_piece, last_piece + 1):
            piece_end = tl.load(piece_ends_ptr + piece)
            destination = tl.load(piece_states_ptr + piece)
            values = _inputs(x_ptr, x_stride, slot_state_ptr, state_channel_stride, piece_end - (KERNEL_SIZE - 1) +
                             window, channels, window_mask, start, state_start, KERNEL_SIZE)
            tl.debug_barrier()  # the slot's state read by every thread before the last piece overwrites it
            tl.store(state_ptr + destination * state_row_stride + state_offsets, values, mask=window_mask)


def causal_conv_rows(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, rows: tuple[torch.Tensor, ...],
                     max_row_tokens: int, use_pdl: bool = False) -> torch.Tensor:
    """x [tokens, channels] (the rows' [q; k; v] columns, rows packed one after another), weight [channels, K],
    state [state rows, channels, K - 1] (read at the rows' slots, written at their pieces' state rows, in place);
    `rows` = (slots [rows], keeps [rows] float32, row_starts [rows], row_pieces [rows + 1], piece_ends [pieces],
    piece_states [pieces]) as gpu/kernels/gated_delta_rows.py takes them; `max_row_tokens` the longest row's tokens
    (the grid's token blocks). Returns silu(conv(x)) [tokens, channels] in x's dtype."""
    _check(x, weight, state, rows)
    num_tokens, num_channels = x.shape
    kernel_size = weight.shape[1]
    out = torch.empty(num_tokens, num_channels, dtype=x.dtype, device=x.device)
    slots, keeps, row_starts, row_pieces, piece_ends, piece_states = rows
    num_rows = slots.shape[0]
    if num_rows == 0 or num_channels == 0:
        return out
    block_t = max(BLOCK_TOKENS, triton.next_power_of_2(kernel_size - 1))  # a later block reads no state
    grid = (num_rows, triton.cdiv(num_channels, BLOCK_CHANNELS), triton.cdiv(max(max_row_tokens, 1), block_t))
    pdl = uses_pdl(use_pdl, x)
    _causal_conv_rows_kernel[grid](
        x, x.stride(0), weight, weight.stride(0), state, state.stride(0), state.stride(1), out,
        slots, keeps, row_starts, row_pieces, piece_ends, piece_states,
        CHANNELS=num_channels, KERNEL_SIZE=kernel_size, BLOCK_C=BLOCK_CHANNELS, BLOCK_T=block_t,
        BLOCK_W=triton.next_power_of_2(max(kernel_size - 1, 1)), USE_PDL=pdl, launch_pdl=pdl,
        num_warps=4,
        enable_fp_fusion=False,  # float32 products rounded before their sum (16-bit ones are exact either way)
    )
    return out


def _check(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, rows: tuple[torch.Tensor, ...]) -> None:
    if x.dim() != 2 or weight.dim() != 2 or state.dim() != 3:
        raise ValueError(f"x [tokens, channels], weight [channels, K] and state [rows, channels, K - 1] expected, got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}, {tuple(state.shape)}")
    num_channels, kernel_size = weight.shape
    if x.shape[1] != num_channels or state.shape[1:] != (num_channels, kernel_size - 1) or kernel_size < 2:
        raise ValueError(f"{num_channels} channels of a kernel of {kernel_size} need x [tokens, {num_channels}] and "
                         f"state [rows, {num_channels}, {kernel_size - 1}], got {tuple(x.shape)}, "
                         f"{tuple(state.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1 or state.stride(2) != 1:
        raise ValueError("x's columns, the weight's taps and the state's inputs must have unit stride")
    if x.dtype != weight.dtype or x.dtype != state.dtype:
        raise ValueError(f"x, weight and state in one dtype expected, got {x.dtype}, {weight.dtype}, {state.dtype}")
    slots, keeps, row_starts, row_pieces, piece_ends, piece_states = rows
    if keeps.dtype != torch.float32 or any(t.dtype != torch.int64 for t in (slots, row_starts, row_pieces, piece_ends,
                                                                             piece_states)):
        raise ValueError("the rows' keeps must be float32 and their indices int64")
    num_rows = slots.shape[0]
    if keeps.shape != (num_rows,) or row_starts.shape != (num_rows,) or row_pieces.shape != (num_rows + 1,) or \
            piece_ends.shape != piece_states.shape:
        raise ValueError(f"{num_rows} rows need [rows] keeps and starts, [rows + 1] piece counts and equal pieces' "
                         f"ends and states, got {tuple(keeps.shape)}, {tuple(row_starts.shape)}, "
                         f"{tuple(row_pieces.shape)}, {tuple(piece_ends.shape)}, {tuple(piece_states.shape)}")
