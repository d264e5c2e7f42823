"""The gated delta rule's decode kernel (gpu/kernels/gated_delta_decode.py) under Triton's interpreter on the CPU,
against the torch reference (gpu/layers/gated_delta_rule.py): each row's state read from its slot (zeros where the
row starts its sequence), updated in place, the other slots untouched. tests/gpu/test_gated_deltanet_gpu.py checks
the compiled kernel on CUDA."""

import os

import pytest
import torch

from gpu.layers import gated_delta_rule

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.gated_delta_decode import gated_delta_decode  # noqa: E402


@pytest.mark.parametrize("heads", [(2, 4, 16, 16), (1, 1, 8, 40)])  # grouped value heads; value columns in blocks
def test_decode_kernel_matches_the_reference(heads: tuple[int, int, int, int]) -> None:
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    generator = torch.Generator().manual_seed(3)
    rows, num_slots = 3, 5
    qkv = torch.randn(rows, 2 * num_key_heads * key_dim + num_value_heads * value_dim, generator=generator)
    g = -torch.rand(rows, num_value_heads, generator=generator)
    beta = torch.rand(rows, num_value_heads, generator=generator)
    state = torch.randn(num_slots, num_value_heads, key_dim, value_dim, generator=generator)
    slots = torch.tensor([4, 0, 2])
    keeps = torch.tensor([1.0, 0.0, 1.0])
    q, k, v = qkv.split([num_key_heads * key_dim, num_key_heads * key_dim, num_value_heads * value_dim], dim=-1)
    expected, expected_state = gated_delta_rule.recurrent(
        q.reshape(rows, num_key_heads, key_dim), k.reshape(rows, num_key_heads, key_dim),
        v.reshape(rows, num_value_heads, value_dim), g, beta, state[slots] * keeps[:, None, None, None])
    before = state.clone()
    out = gated_delta_decode(qkv, heads, g, beta, state, slots, keeps)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[slots], expected_state, rtol=1e-5, atol=1e-5)
    untouched = [1, 3]
    assert torch.equal(state[untouched], before[untouched])


def _reference_rows(qkv: torch.Tensor, heads: tuple[int, int, int, int], g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, rows: list[tuple[int, int, int, float]]
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The torch rule over each (start, end, slot, keeps) row alone: (output, each row's states after 1, 2, ... of
    its tokens)."""
    num_key_heads, num_value_heads, key_dim, value_dim = heads
    q, k, v = qkv.split([num_key_heads * key_dim, num_key_heads * key_dim, num_value_heads * value_dim], dim=-1)
    q, k = q.reshape(-1, num_key_heads, key_dim), k.reshape(-1, num_key_heads, key_dim)
    v = v.reshape(-1, num_value_heads, value_dim)
    outputs, states_along = [], []
    for start, end, slot, keeps in rows:
        current = state[slot : slot + 1] * keeps
        along = []
        for t in range(start, end):
            out, current = gated_delta_rule.recurrent(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1],
                                                      beta[t : t + 1], current)
            outputs.append(out)
            along.append(current[0])
        whole, final = gated_delta_rule.chunked(q[start:end], k[start:end], v[start:end], g[start:end],
                                                beta[start:end], state[slot] * keeps)
        torch.testing.assert_close(final, along[-1], rtol=1e-4, atol=1e-4)  # the two torch forms agree
        states_along.append(torch.stack(along))
    return torch.cat(outputs), states_along


@pytest.mark.parametrize("heads", [(2, 4, 16, 16), (1, 2, 8, 40)])  # grouped value heads; value columns in blocks
def test_rows_kernel_matches_the_reference_with_snapshots_inside_rows(heads: tuple[int, int, int, int]) -> None:
    from gpu.kernels.gated_delta_rows import gated_delta_rows
    from gpu.state_cache import sequential_rows

    num_key_heads, num_value_heads, key_dim, value_dim = heads
    generator = torch.Generator().manual_seed(5)
    lengths, slots, keeps = [1, 3, 17, 40], [4, 0, 2, 1], [1.0, 0.0, 1.0, 0.0]
    # (tokens into the row, snapshot row) where a row's state is saved inside it, by row
    saves = {1: [(1, 6)], 2: [(5, 7), (16, 8)], 3: [(32, 9)]}
    starts = [0, 1, 4, 21, 61]
    num_tokens = starts[-1]
    qkv = torch.randn(num_tokens, 2 * num_key_heads * key_dim + num_value_heads * value_dim, generator=generator)
    g = -torch.rand(num_tokens, num_value_heads, generator=generator)
    beta = torch.rand(num_tokens, num_value_heads, generator=generator)
    state = torch.randn(11, num_value_heads, key_dim, value_dim, generator=generator)
    row_pieces = []
    for row in range(4):
        cuts = [(starts[row] + n, snapshot) for n, snapshot in saves.get(row, [])]
        bounds = [starts[row], *(end for end, _ in cuts)]
        row_pieces.append((*((s, e, snapshot) for s, (e, snapshot) in zip(bounds, cuts, strict=False)),
                           (bounds[-1], starts[row + 1], None)))
    pieces = sequential_rows(tuple(row_pieces), slots, torch.device("cpu"))
    expected, along = _reference_rows(qkv, heads, g, beta, state, [
        (starts[r], starts[r + 1], slots[r], keeps[r]) for r in range(4)])
    before = state.clone()
    out = gated_delta_rows(qkv, heads, g, beta, state, (
        torch.tensor(slots), torch.tensor(keeps), pieces.row_starts, pieces.row_pieces, pieces.piece_ends,
        pieces.piece_states))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for row in range(4):
        torch.testing.assert_close(state[slots[row]], along[row][-1], rtol=1e-5, atol=1e-5)
        for num_tokens_in, snapshot in saves.get(row, []):
            torch.testing.assert_close(state[snapshot], along[row][num_tokens_in - 1], rtol=1e-5, atol=1e-5)
    untouched = [3, 5, 10]
    assert torch.equal(state[untouched], before[untouched])
