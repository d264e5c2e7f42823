"""The state cache of linear-attention layers (gpu/layers/gated_deltanet.py): beside the paged KV cache, one conv
state and one recurrent state per layer for each of `num_slots` sequence slots. core/ gives each running sequence a
slot (the batch's `state_slots`); a step gathers its rows' states by slot and scatters them back. A row that starts
its sequence (its first token: a new prompt, or one recomputed after a preemption) reads zeros, so a freed slot
needs no clearing.

Prefix caching (core/state_snapshots.py) keeps states at block boundaries in further rows after the slots: a step
copies a snapshot into a slot before its forward, and a slot into a snapshot after it (`copy_rows`). On CUDA one
last row is the padded rows' of the decode graphs and the mixed graphs (gpu/cuda_graphs.py, gpu/mixed_graphs.py), read
as zeros and written, never used.

Every layer's states of a kind are one stacked tensor ([layers, rows, ...], `StackedStates`), each layer's
`conv_state` and `recurrent_state` a view of its index: so a row copy is one gather and one scatter per kind for all
layers at once, not per layer (a step with prefix hits copies rows before and after its forward). The layers must
share one shape (a model's Gated DeltaNet layers do), and nothing may assign a layer's state tensors after
`allocate`, only write into them.

Sized before the KV cache, so the KV cache is sized from what the states leave.
"""

from dataclasses import dataclass, replace
from functools import cache, partial

import numpy as np
import torch

from gpu.attention.metadata import ConvWindows, LinearStateMetadata, PieceLevel, PositionStep, SequentialRows
from gpu.batch import Batch
from gpu.host_to_device import to_device
from gpu.layers.gated_deltanet import GatedDeltaNet

RECURRENT_DTYPE = torch.float32  # the delta rule adds into the state at every token: kept at full precision


def bytes_per_slot(layers: list[GatedDeltaNet], dtype: torch.dtype) -> int:
    element_size = torch.empty(0, dtype=dtype).element_size()
    recurrent_size = torch.empty(0, dtype=RECURRENT_DTYPE).element_size()
    total = 0
    for layer in layers:
        s = layer.spec
        total += s.conv_dim * (s.conv_kernel_size - 1) * element_size
        total += s.num_value_heads * s.key_head_dim * s.value_head_dim * recurrent_size
    return total


@dataclass(frozen=True)
class StackedStates:
    """Every linear layer's states, stacked; layer i's `conv_state` and `recurrent_state` are views of index i."""

    conv: torch.Tensor  # [layers, rows, conv_dim, K - 1] in the model's dtype
    recurrent: torch.Tensor  # [layers, rows, value_heads, key_head_dim, value_head_dim] float32


def allocate(layers: list[GatedDeltaNet], num_rows: int, dtype: torch.dtype, device: torch.device) -> StackedStates:
    """Zeroed states of `num_rows` rows for every layer, stacked; each layer given its views."""
    shapes = {(s.conv_dim, s.conv_kernel_size, s.num_value_heads, s.key_head_dim, s.value_head_dim)
              for s in (layer.spec for layer in layers)}
    if len(shapes) != 1:
        raise ValueError(f"the linear layers' states are stacked, so they need one shape, got {sorted(shapes)}")
    conv_dim, kernel_size, num_value_heads, key_head_dim, value_head_dim = shapes.pop()
    states = StackedStates(
        conv=torch.zeros(len(layers), num_rows, conv_dim, kernel_size - 1, dtype=dtype, device=device),
        recurrent=torch.zeros(len(layers), num_rows, num_value_heads, key_head_dim, value_head_dim,
                              dtype=RECURRENT_DTYPE, device=device))
    for index, layer in enumerate(layers):
        layer.conv_state, layer.recurrent_state = states.conv[index], states.recurrent[index]
    return states


def copy_rows(states: StackedStates | None, copies: list[tuple[int, int]], device: torch.device) -> None:
    """Every layer's state row `source` copied to row `destination`, for each (source, destination) (destinations
    distinct; every source read before any destination is written): one gather and one scatter per kind of state,
    all layers at once."""
    if states is None or not copies:
        return
    sources, destinations = to_device(np.asarray(copies, dtype=np.int64).T, np.int64, device).unbind()
    for stacked in (states.conv, states.recurrent):
        stacked.index_copy_(1, destinations, stacked.index_select(1, sources))


def step_inputs(batch: Batch, device: torch.device, num_state_slots: int) -> LinearStateMetadata:
    """Each row's state slot, whether it continues its state (tokens before its new ones: context > query), and its
    tokens in pieces that end where a snapshot is saved inside the row (`saves_at_row_ends` are the runner's). A step
    with both one-token rows and longer ones is split in two parts: the one-token rows run at once as a decode step
    does, the others row by row."""
    slots, continues, saves_inside = _rows_of(batch, num_state_slots)
    rows = range(batch.num_rows)
    whole = _state_inputs([(slots[r], continues[r], batch.query_lens[r], saves_inside.get(r, [])) for r in rows],
                          device)
    drafts = batch.num_draft_tokens or [0] * batch.num_rows
    one_token = [r for r in rows if batch.query_lens[r] == 1]
    verifying = [r for r in rows if batch.query_lens[r] > 1 and drafts[r]]
    others = [r for r in rows if batch.query_lens[r] > 1 and not drafts[r]]
    if batch.is_decode_only or (not one_token and not verifying):
        return whole
    starts = np.cumsum([0, *batch.query_lens]).tolist()
    parts = []
    for part_rows in (one_token, verifying, others):
        if not part_rows:
            continue
        part = _state_inputs([(slots[r], continues[r], batch.query_lens[r], saves_inside.get(r, []))
                              for r in part_rows], device)
        if part_rows is verifying:
            part = replace(part, by_position=_position_steps(batch, part_rows, slots, continues, saves_inside, device))
        token_index = np.concatenate([np.arange(starts[r], starts[r + 1]) for r in part_rows])
        parts.append((part, to_device(token_index, np.int64, device)))
    if len(parts) == 1:
        return parts[0][0]
    return replace(whole, parts=tuple(parts))


def _rows_of(batch: Batch, num_state_slots: int) -> tuple[list[int], list[bool], dict[int, list[tuple[int, int]]]]:
    """Each row's state slot, whether it continues its state (tokens before its new ones: context > query), and per
    row the (tokens into it, snapshot row) of the saves inside it (`saves_at_row_ends` are the runner's)."""
    slots = batch.state_slots or [row % num_state_slots for row in range(batch.num_rows)]  # warm-up steps
    continues = [c > q for c, q in zip(batch.context_lens, batch.query_lens, strict=True)]
    saves_inside: dict[int, list[tuple[int, int]]] = {}
    for row, num_tokens, snapshot in batch.state_saves:
        if num_tokens < batch.query_lens[row]:
            saves_inside.setdefault(row, []).append((num_tokens, snapshot))
    return slots, continues, saves_inside


def padded_rows_size(num_tokens: int, num_rows: int) -> int:
    """The int64 entries of `padded_rows`' buffer for a step padded to `num_tokens` tokens and `num_rows` rows: slots,
    row starts, [rows + 1] piece counts, then the pieces' ends and state rows (each piece has a token, and each
    padding row one empty piece: at most tokens + rows pieces)."""
    return 3 * num_rows + 1 + 2 * (num_tokens + num_rows)


def padded_rows(int64: torch.Tensor, keeps_state: torch.Tensor, num_tokens: int, num_rows: int,
                max_row_tokens: int) -> LinearStateMetadata:
    """The linear layers' inputs of a step padded to `num_tokens` tokens and `num_rows` rows (gpu/mixed_graphs.py),
    as views of a flat int64 buffer and a float32 one that `fill_padded_rows` writes: every row through the sequential
    kernels in one launch each (no part, no host-built index), the conv kernel's grid from `max_row_tokens` (at least
    any row's tokens), so the launches depend on the padded sizes only."""
    slots, row_starts, row_pieces, piece_ends, piece_states = int64[: padded_rows_size(num_tokens, num_rows)].split(
        [num_rows, num_rows, num_rows + 1, num_tokens + num_rows, num_tokens + num_rows])
    rows = SequentialRows(row_starts, row_pieces, piece_ends, piece_states)
    return LinearStateMetadata(slots, keeps_state[:num_rows], continues=(), row_pieces=(), is_one_token_per_row=False,
                               sequential_rows=lambda: rows, max_row_tokens=max_row_tokens)


def fill_padded_rows(int64: np.ndarray, keeps_state: np.ndarray, batch: Batch | None, num_tokens: int,
                     num_rows: int, num_state_slots: int, padding_slot: int) -> int:
    """Writes the batch's rows (None: none, as graphs are captured) padded to `num_rows` into host buffers laid out
    as `padded_rows` reads them; returns how many leading int64 entries to copy. A padding row has the padding slot,
    starts its state (keeps 0), and one empty piece at token 0: the convolution stores zeros to the padding slot, the
    delta rule runs no token and stores nothing, and neither writes an output."""
    slots, continues, row_pieces = [], [], []
    if batch is not None:
        slots, continues, saves_inside = _rows_of(batch, num_state_slots)
        starts = np.cumsum([0, *batch.query_lens]).tolist()
        row_pieces = [_pieces(starts[r], starts[r + 1], saves_inside.get(r, [])) for r in range(batch.num_rows)]
    padding = num_rows - len(slots)
    padded_slots = [*slots, *[padding_slot] * padding]
    row_starts, counts, ends, states = _sequential_arrays((*row_pieces, *[((0, 0, None),)] * padding), padded_slots)
    size = padded_rows_size(num_tokens, num_rows)
    fields = np.split(int64[:size], np.cumsum([num_rows, num_rows, num_rows + 1, num_tokens + num_rows]))
    fields[0][:] = padded_slots
    fields[1][:] = row_starts
    fields[2][:] = counts
    fields[3][: len(ends)], fields[3][len(ends) :] = ends, 0
    fields[4][: len(states)], fields[4][len(states) :] = states, padding_slot
    keeps_state[: len(continues)], keeps_state[len(continues) : num_rows] = continues, 0.0
    return size


def _position_steps(batch: Batch, rows: list[int], slots: list[int], continues: list[bool],
                    saves_inside: dict[int, list[tuple[int, int]]], device: torch.device) -> tuple[PositionStep, ...]:
    """The rows' tokens position by position (see LinearStateMetadata.by_position), indexed among the rows' own."""
    starts = np.cumsum([0, *(batch.query_lens[r] for r in rows)]).tolist()
    saves = [dict(saves_inside.get(r, [])) for r in rows]
    steps = []
    for i in range(max(batch.query_lens[r] for r in rows)):
        here = [k for k, r in enumerate(rows) if batch.query_lens[r] > i]
        steps.append(PositionStep(
            tokens=to_device(np.asarray([starts[k] + i for k in here], dtype=np.int64), np.int64, device),
            slots=to_device(np.asarray([slots[rows[k]] for k in here], dtype=np.int64), np.int64, device),
            keeps_state=to_device(np.asarray([1.0 if i or continues[rows[k]] else 0.0 for k in here],
                                             dtype=np.float32), np.float32, device),
            saves_to=to_device(np.asarray([saves[k].get(i + 1, slots[rows[k]]) for k in here], dtype=np.int64),
                               np.int64, device)))
    return tuple(steps)


def _state_inputs(rows: list[tuple[int, bool, int, list[tuple[int, int]]]], device: torch.device
                  ) -> LinearStateMetadata:
    """The state inputs of rows (slot, continues, tokens, saves inside) packed one after another, with the builders
    of their pieces' index tensors where they can run row by row (not every row of one token)."""
    starts = np.cumsum([0, *(num_tokens for _, _, num_tokens, _ in rows)]).tolist()
    continues = tuple(c for _, c, _, _ in rows)
    row_pieces = tuple(_pieces(starts[i], starts[i + 1], saves) for i, (_, _, _, saves) in enumerate(rows))
    is_one_token_per_row = all(num_tokens == 1 for _, _, num_tokens, _ in rows)
    slots = [slot for slot, _, _, _ in rows]
    return LinearStateMetadata(
        slots=to_device(np.asarray(slots, dtype=np.int64), np.int64, device),
        keeps_state=to_device(np.asarray(continues, dtype=np.float32), np.float32, device),
        continues=continues,
        row_pieces=row_pieces,
        is_one_token_per_row=is_one_token_per_row,
        levels=None if is_one_token_per_row else cache(partial(piece_levels, row_pieces, device)),
        conv_windows=None if is_one_token_per_row else cache(partial(conv_windows, row_pieces, device)),
        sequential_rows=None if is_one_token_per_row else cache(partial(sequential_rows, row_pieces, slots, device)),
        max_row_tokens=max((num_tokens for _, _, num_tokens, _ in rows), default=0))


def piece_levels(row_pieces: tuple[tuple[tuple[int, int, int | None], ...], ...], device: torch.device
                 ) -> tuple[PieceLevel, ...]:
    """The rows' k-th pieces for k = 0, 1, ... (LinearStateMetadata.levels); one level, every token in order, where
    no row is cut."""
    num_levels = max(len(pieces) for pieces in row_pieces)
    levels = []
    for level in range(num_levels):
        rows = [row for row, pieces in enumerate(row_pieces) if len(pieces) > level]
        ranges = [row_pieces[row][level] for row in rows]
        lengths = np.asarray([end - start for start, end, _ in ranges], dtype=np.int64)
        cu_seqlens_cpu = torch.from_numpy(np.concatenate(([0], np.cumsum(lengths))))
        saved = [(position, snapshot) for position, (_, _, snapshot) in enumerate(ranges) if snapshot is not None]
        tokens = np.concatenate([np.arange(start, end) for start, end, _ in ranges])
        levels.append(PieceLevel(
            tokens=None if num_levels == 1 else to_device(tokens, np.int64, device),
            rows=None if len(rows) == len(row_pieces) else to_device(rows, np.int64, device),
            cu_seqlens=to_device(cu_seqlens_cpu.numpy(), np.int64, device), cu_seqlens_cpu=cu_seqlens_cpu,
            saves=_index_pair(saved, device)))
    return tuple(levels)


def sequential_rows(row_pieces: tuple[tuple[tuple[int, int, int | None], ...], ...], slots: list[int],
                    device: torch.device) -> SequentialRows:
    """The rows' pieces for the sequential kernel (SequentialRows): a piece's state goes to its snapshot row, the last
    piece's to the row's slot; one host-to-device copy. Every piece has a token (the kernel stores a state after a
    piece's last token)."""
    if any(end <= start for pieces in row_pieces for start, end, _ in pieces):
        raise ValueError(f"the sequential kernel's pieces each need a token, got {row_pieces}")
    num_rows = len(row_pieces)
    row_starts, counts, ends, states = _sequential_arrays(row_pieces, slots)
    packed = to_device(np.asarray([*row_starts, *counts, *ends, *states], dtype=np.int64), np.int64, device)
    num_pieces = len(ends)
    bounds = np.cumsum([0, num_rows, num_rows + 1, num_pieces, num_pieces]).tolist()
    return SequentialRows(*(packed[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)))


def _sequential_arrays(row_pieces: tuple[tuple[tuple[int, int, int | None], ...], ...], slots: list[int]
                       ) -> tuple[list[int], list[int], list[int], list[int]]:
    """SequentialRows' four fields on the host: row starts, cumulative piece counts, piece ends, piece state rows."""
    row_starts = [pieces[0][0] for pieces in row_pieces]
    counts = np.cumsum([0, *(len(pieces) for pieces in row_pieces)]).tolist()
    ends = [end for pieces in row_pieces for _, end, _ in pieces]
    states = [slots[row] if snapshot is None else snapshot for row, pieces in enumerate(row_pieces)
              for _, _, snapshot in pieces]
    return row_starts, counts, ends, states


def conv_windows(row_pieces: tuple[tuple[tuple[int, int, int | None], ...], ...], device: torch.device,
                 kernel_size: int) -> ConvWindows:
    """The rows' windows for a convolution of `kernel_size` (ConvWindows): row r's window starts at column
    start_r + r * (K - 1), and after p of its tokens its conv state is the window's columns [p, p + K - 1)."""
    width = kernel_size - 1
    num_rows = len(row_pieces)
    starts = np.asarray([pieces[0][0] for pieces in row_pieces], dtype=np.int64)
    lengths = np.asarray([pieces[-1][1] - pieces[0][0] for pieces in row_pieces], dtype=np.int64)
    window_starts = starts + width * np.arange(num_rows)
    state_columns = np.arange(num_rows * width).reshape(num_rows, width)
    gather = np.concatenate([np.concatenate((state_columns[r], num_rows * width + np.arange(starts[r],
                                                                                              starts[r] + lengths[r])))
                             for r in range(num_rows)])
    row_of_token = np.repeat(np.arange(num_rows), lengths)
    outputs = np.arange(len(row_of_token)) + width * row_of_token
    finals = (window_starts + lengths)[:, None] + np.arange(width)
    saved = [(row, end - pieces[0][0], snapshot) for row, pieces in enumerate(row_pieces)
             for _, end, snapshot in pieces if snapshot is not None]
    saves = None
    if saved:
        columns = np.asarray([window_starts[row] + num_tokens for row, num_tokens, _ in saved])[:, None] + \
            np.arange(width)
        saves = (to_device(columns, np.int64, device), to_device([s for _, _, s in saved], np.int64, device))
    if num_rows == 1:
        return ConvWindows(None, None, to_device(finals, np.int64, device), saves)
    return ConvWindows(to_device(gather, np.int64, device), to_device(outputs, np.int64, device),
                       to_device(finals, np.int64, device), saves)


def _index_pair(pairs: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two [len(pairs)] int64 device tensors from (a, b) pairs, in one copy; None where there are none."""
    if not pairs:
        return None
    both = to_device(np.asarray(pairs, dtype=np.int64).T, np.int64, device)
    return both[0], both[1]


def _pieces(start: int, end: int, saves: list[tuple[int, int]]) -> tuple[tuple[int, int, int | None], ...]:
    """The tokens [start, end) of a row cut where its state is saved (after `num_tokens` of them, to a snapshot)."""
    pieces, piece_start = [], start
    for num_tokens, snapshot in sorted(saves):
        pieces.append((piece_start, start + num_tokens, snapshot))
        piece_start = start + num_tokens
    return (*pieces, (piece_start, end, None))


def saves_at_row_ends(batch: Batch) -> list[tuple[int, int]]:
    """(slot, snapshot row) of the saves at the end of their row: copied after the step's forward."""
    return [(batch.state_slots[row], snapshot) for row, num_tokens, snapshot in batch.state_saves
            if num_tokens == batch.query_lens[row]]
