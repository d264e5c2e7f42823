"""The index tensors of a step's rows run row by row (gpu/state_cache.py), built once per step for every linear
layer: the delta rule's levels of pieces and the convolution's windows, as exact indices."""

import torch

from gpu.batch import Batch
from gpu.state_cache import conv_windows, piece_levels, step_inputs

# Row 0: tokens [0, 5) cut after 3 (snapshot row 6); row 1: tokens [5, 7) whole.
PIECES = (((0, 3, 6), (3, 5, None)), ((5, 7, None),))
CPU = torch.device("cpu")


def test_levels_hold_the_k_th_pieces_of_the_rows_that_have_one() -> None:
    first, second = piece_levels(PIECES, CPU)
    assert first.tokens is not None and first.tokens.tolist() == [0, 1, 2, 5, 6]
    assert first.rows is None  # every row has a first piece
    assert first.cu_seqlens_cpu.tolist() == first.cu_seqlens.tolist() == [0, 3, 5]
    assert first.saves is not None and [t.tolist() for t in first.saves] == [[0], [6]]
    assert second.tokens is not None and second.tokens.tolist() == [3, 4]
    assert second.rows is not None and second.rows.tolist() == [0]
    assert second.cu_seqlens_cpu.tolist() == [0, 2]
    assert second.saves is None


def test_one_level_runs_every_token_in_order() -> None:
    (level,) = piece_levels((((0, 4, None),), ((4, 5, None),)), CPU)
    assert level.tokens is None and level.rows is None and level.saves is None
    assert level.cu_seqlens_cpu.tolist() == [0, 4, 5]


def test_conv_windows_put_each_row_s_state_before_its_tokens() -> None:
    """Kernel 3 (2 state inputs): sources are [row 0's state (0, 1), row 1's (2, 3); tokens (4 ...)], the windows
    [s0 s1 x0 .. x4 | s0' s1' x5 x6] at columns 0-6 and 7-10."""
    windows = conv_windows(PIECES, CPU, 3)
    assert windows.gather is not None and windows.gather.tolist() == [0, 1, 4, 5, 6, 7, 8, 2, 3, 9, 10]
    assert windows.outputs is not None and windows.outputs.tolist() == [0, 1, 2, 3, 4, 7, 8]
    assert windows.finals.tolist() == [[5, 6], [9, 10]]
    assert windows.saves is not None
    assert windows.saves[0].tolist() == [[3, 4]]  # x1, x2: the inputs before the cut
    assert windows.saves[1].tolist() == [6]


def test_one_row_s_window_is_its_sources_in_order() -> None:
    windows = conv_windows((((0, 3, 6), (3, 5, None)),), CPU, 4)
    assert windows.gather is None and windows.outputs is None
    assert windows.finals.tolist() == [[5, 6, 7]]
    assert windows.saves is not None and windows.saves[0].tolist() == [[3, 4, 5]]


def test_a_step_s_pieces_are_built_once_for_every_layer() -> None:
    batch = Batch(token_ids=[0] * 7, positions=[0] * 7, slot_mapping=[0] * 7, query_lens=[5, 2], context_lens=[5, 4],
                  block_tables=[[0], [0]], state_slots=[0, 1], state_saves=[(0, 3, 6)])
    state = step_inputs(batch, CPU, 8)
    assert state.levels is not None and state.conv_windows is not None
    assert state.levels() is state.levels()
    assert state.conv_windows(4) is state.conv_windows(4)
    assert [level.cu_seqlens_cpu.tolist() for level in state.levels()] == [[0, 3, 5], [0, 2]]


def test_one_token_rows_build_no_pieces() -> None:
    batch = Batch(token_ids=[0] * 2, positions=[0] * 2, slot_mapping=[0] * 2, query_lens=[1, 1], context_lens=[5, 4],
                  block_tables=[[0], [0]], state_slots=[0, 1])
    state = step_inputs(batch, CPU, 8)
    assert state.levels is None and state.conv_windows is None
