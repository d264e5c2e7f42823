"""The prompt rows' causal convolution kernel (gpu/kernels/causal_conv_rows.py) under Triton's interpreter on the CPU,
against the torch code it replaces (gpu/layers/gated_delta_rule.py's `conv_packed` over gpu/state_cache.py's
`conv_windows`, as GatedDeltaNet._convolved_rows runs it): rows that start their sequence and rows that continue it,
snapshots saved inside rows (one within a row's first K - 1 tokens), rows shorter than K - 1, rows longer than a
token block, channel counts that are not a multiple of the channel block, kernels of 2 to 6 taps. The conv states
written are copies of inputs, so they must be equal to the bit; the outputs within an ulp of the dtype (torch's CPU
convolution and exp against the interpreter's; float32 within rounding). tests/gpu/test_gated_deltanet_gpu.py checks
the compiled kernel on CUDA."""

import os

import pytest
import torch

from gpu.layers import gated_delta_rule
from gpu.state_cache import conv_windows, sequential_rows
from tests.ulps import ulps

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.causal_conv_rows import causal_conv_rows  # noqa: E402

CPU = torch.device("cpu")
NUM_STATE_ROWS = 12  # slots 0-5, snapshot rows 6-11
# Per row: (tokens, slot, continues its state, [(tokens into the row, snapshot row)] saved inside it)
ROWS = [
    (5, 4, True, [(2, 6)]),  # a cut within the row's first K - 1 tokens: the snapshot holds some of the state read
    (1, 0, True, []),  # shorter than K - 1: the slot keeps part of its state, shifted
    (37, 2, False, [(16, 7), (17, 8), (33, 9)]),  # starts its sequence; three token blocks; cuts next to each other
    (2, 1, False, []),  # starts its sequence, shorter than K - 1: zeros kept before its tokens
    (20, 3, True, []),
    (4, 5, True, [(1, 10)]),  # shorter than K - 1 = 5 for 6 taps, with a cut
]


def row_pieces(rows: list[tuple[int, int, bool, list[tuple[int, int]]]]
               ) -> tuple[tuple[tuple[int, int, int | None], ...], ...]:
    """The rows' pieces as gpu/state_cache.py cuts them: [start, end) among the step's tokens, each ending where a
    snapshot is saved (None: the row's last piece)."""
    pieces, start = [], 0
    for num_tokens, _, _, saves in rows:
        bounds = [start, *(start + n for n, _ in saves), start + num_tokens]
        snapshots = [*(snapshot for _, snapshot in saves), None]
        pieces.append(tuple(zip(bounds[:-1], bounds[1:], snapshots, strict=True)))
        start += num_tokens
    return tuple(pieces)


def torch_rows(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, keeps: torch.Tensor,
               pieces: tuple[tuple[tuple[int, int, int | None], ...], ...]) -> torch.Tensor:
    """GatedDeltaNet._convolved_rows's torch code over the rows: the output, `state` written in place."""
    windows = conv_windows(pieces, CPU, weight.shape[1])
    initial = state[slots] * keeps[:, None, None].to(state.dtype)
    out, window = gated_delta_rule.conv_packed(x, initial, weight, windows.gather, windows.outputs)
    if windows.saves is not None:
        columns, snapshots = windows.saves
        state[snapshots] = window[columns].transpose(1, 2)
    state[slots] = window[windows.finals].transpose(1, 2)
    return out


def kernel_rows(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, keeps: torch.Tensor,
                pieces: tuple[tuple[tuple[int, int, int | None], ...], ...]) -> torch.Tensor:
    rows = sequential_rows(pieces, slots.tolist(), CPU)
    max_row_tokens = max(p[-1][1] - p[0][0] for p in pieces)
    return causal_conv_rows(x, weight, state, (slots, keeps, rows.row_starts, rows.row_pieces, rows.piece_ends,
                                               rows.piece_states), max_row_tokens)


def inputs(rows: list[tuple[int, int, bool, list[tuple[int, int]]]], num_channels: int, kernel_size: int,
           dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """(x: a column slice of a wider projection, weight [C, K] as the layer's conv1d.weight[:, 0], state, slots,
    keeps)."""
    generator = torch.Generator().manual_seed(seed)
    num_tokens = sum(n for n, _, _, _ in rows)
    projected = torch.randn(num_tokens, num_channels + 7, generator=generator).to(dtype)
    x = projected[:, 3 : 3 + num_channels]
    weight = (torch.randn(num_channels, 1, kernel_size, generator=generator) * 0.5).to(dtype)[:, 0]
    state = torch.randn(NUM_STATE_ROWS, num_channels, kernel_size - 1, generator=generator).to(dtype)
    slots = torch.tensor([slot for _, slot, _, _ in rows])
    keeps = torch.tensor([1.0 if continues else 0.0 for _, _, continues, _ in rows])
    return x, weight, state, slots, keeps



def assert_kernel_is_torch(rows: list[tuple[int, int, bool, list[tuple[int, int]]]], num_channels: int,
                           kernel_size: int, dtype: torch.dtype) -> None:
    x, weight, state, slots, keeps = inputs(rows, num_channels, kernel_size, dtype, seed=num_channels + kernel_size)
    pieces = row_pieces(rows)
    expected_state = state.clone()
    expected = torch_rows(x, weight, expected_state, slots, keeps, pieces)
    got = kernel_rows(x, weight, state, slots, keeps, pieces)
    assert got.dtype == dtype and got.shape == expected.shape
    assert torch.equal(state, expected_state), (state != expected_state).nonzero()[:8].tolist()
    if dtype == torch.float32:  # sums in another order: near zero far apart in ulps, close in value
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        return
    differ = ulps(got, expected)
    assert differ.max() <= 1 and (differ > 0).float().mean() < 0.02, (int(differ.max()), float((differ > 0).mean()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("num_channels", "kernel_size"), [(300, 4), (37, 4), (64, 2), (19, 6)])
def test_kernel_is_the_torch_convolution(dtype: torch.dtype, num_channels: int, kernel_size: int) -> None:
    """Every row kind at once; 300 channels: a partial second channel block; 6 taps: a state window of 5 (a padded
    power of two)."""
    assert_kernel_is_torch(ROWS, num_channels, kernel_size, dtype)


@pytest.mark.parametrize("rows", [
    [(1, 3, False, [])],  # one token starting its sequence: a state of zeros and that token
    [(1, 3, True, [])],
    [(3, 0, True, [(1, 5), (2, 6)])],  # a snapshot after every token but the last
    [(64, 2, True, [(48, 5)])],  # one row of whole token blocks
])
def test_single_rows(rows: list[tuple[int, int, bool, list[tuple[int, int]]]]) -> None:
    assert_kernel_is_torch(rows, 40, 4, torch.bfloat16)


def test_rows_that_start_their_sequence_read_no_state() -> None:
    """A starting row's slot may hold anything (a freed slot is not cleared), even NaN: none of it reaches the output
    or the states written."""
    rows = [(2, 1, False, [(1, 6)]), (6, 3, True, [])]
    x, weight, state, slots, keeps = inputs(rows, 24, 4, torch.bfloat16, seed=2)
    pieces = row_pieces(rows)
    expected_state = state.clone()
    expected = torch_rows(x, weight, expected_state, slots, keeps, pieces)
    state[1] = float("nan")
    got = kernel_rows(x, weight, state, slots, keeps, pieces)
    assert not got.isnan().any() and ulps(got, expected).max() <= 1
    assert torch.equal(state, expected_state)
