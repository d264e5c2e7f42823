"""The gated delta rule's two torch forms against transformers' reference functions, and against each other: a
sequence computed in pieces (any split, the state carried between them) equals it computed whole."""

import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from gpu.layers import gated_delta_rule as rule


def inputs(length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(length, 2, 8, generator=generator) for _ in range(2))
    v = torch.randn(length, 4, 8, generator=generator)
    g = -torch.rand(length, 4, generator=generator)
    beta = torch.rand(length, 4, generator=generator)
    return q, k, v, g, beta


@pytest.mark.parametrize("length", [1, 5, 64, 100, 130])
def test_chunked_matches_transformers(length: int) -> None:
    q, k, v, g, beta = inputs(length)
    state = torch.randn(4, 8, 8)
    ours, our_state = rule.chunked(q, k, v, g, beta, state)
    theirs, their_state = hf.torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=state[None], output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(ours, theirs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_state, their_state[0], rtol=1e-5, atol=1e-5)


def test_recurrent_matches_transformers_on_a_batch() -> None:
    q, k, v, g, beta = inputs(3)  # three sequences, one token each
    state = torch.randn(3, 4, 8, 8)
    ours, our_state = rule.recurrent(q, k, v, g, beta, state)
    theirs, their_state = hf.torch_recurrent_gated_delta_rule(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(ours, theirs[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_state, their_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", [1, 30, 64, 99])
def test_pieces_carry_the_state(split: int) -> None:
    q, k, v, g, beta = inputs(100, seed=1)
    whole, whole_state = rule.chunked(q, k, v, g, beta, torch.zeros(4, 8, 8))
    first, state = rule.chunked(q[:split], k[:split], v[:split], g[:split], beta[:split], torch.zeros(4, 8, 8))
    outputs = [first]
    for t in range(split, 100):  # the rest token by token, as decode steps
        out, batched = rule.recurrent(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1],
                                      state[None])
        outputs.append(out)
        state = batched[0]
    torch.testing.assert_close(torch.cat(outputs), whole, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, whole_state, rtol=1e-4, atol=1e-4)


def conv_sequence(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the L tokens of one sequence, x [L, C], from conv_state [C, K - 1], weight [C, K] -> (output
    [L, C], the conv state after the last token: its last K - 1 inputs)."""
    window = torch.cat((conv_state, x.t().to(conv_state.dtype)), dim=-1)  # [C, K - 1 + L]
    out = torch.nn.functional.conv1d(window.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1),
                                     groups=weight.shape[0])[0]
    return torch.nn.functional.silu(out).t().to(x.dtype), window[:, window.shape[1] - conv_state.shape[1] :]


def test_conv_forms_agree_with_transformers() -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(10, 6, generator=generator)
    weight = torch.randn(6, 4, generator=generator)
    whole, state = conv_sequence(x, torch.zeros(6, 3), weight)
    theirs = hf.causal_conv1d_fn(x.t()[None], weight, None, activation="silu")[0].t()
    torch.testing.assert_close(whole, theirs)
    first, state = conv_sequence(x[:7], torch.zeros(6, 3), weight)
    steps = [first]
    for t in range(7, 10):
        out, batched = rule.conv_step(x[t : t + 1], state[None], weight)
        steps.append(out)
        state = batched[0]
    torch.testing.assert_close(torch.cat(steps), whole)


@pytest.mark.parametrize("cuts", [{}, {0: [50], 2: [10, 20], 4: [64]}])
def test_packed_conv_gives_each_sequence_and_every_conv_state_of_its_own(cuts: dict[int, list[int]]) -> None:
    """Sequences convolved at once in one window (each from its own conv state) give what each gives alone, and the
    window's columns hold the conv state after any of a sequence's tokens (where a snapshot cuts it)."""
    from gpu.state_cache import conv_windows

    generator = torch.Generator().manual_seed(3)
    lengths = [70, 1, 30, 5, 130]
    x = torch.randn(sum(lengths), 6, generator=generator)
    weight = torch.randn(6, 4, generator=generator)
    initial = torch.randn(len(lengths), 6, 3, generator=generator)
    row_pieces, start = [], 0
    for row, length in enumerate(lengths):
        bounds = [start, *(start + cut for cut in cuts.get(row, [])), start + length]
        row_pieces.append(tuple((a, b, 10 * row + i if b < bounds[-1] else None)
                                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))))
        start += length
    windows = conv_windows(tuple(row_pieces), torch.device("cpu"), 4)
    out, window = rule.conv_packed(x, initial, weight, windows.gather, windows.outputs)
    expected, snapshots, finals = [], {}, []
    for row, pieces in enumerate(row_pieces):
        state = initial[row]
        for a, b, snapshot in pieces:
            piece_out, state = conv_sequence(x[a:b], state, weight)
            expected.append(piece_out)
            if snapshot is not None:
                snapshots[snapshot] = state
        finals.append(state)
    torch.testing.assert_close(out, torch.cat(expected))
    torch.testing.assert_close(window[windows.finals].transpose(1, 2), torch.stack(finals), rtol=0, atol=0)
    if not cuts:
        assert windows.saves is None
        return
    columns, rows = windows.saves
    assert rows.tolist() == list(snapshots)
    torch.testing.assert_close(window[columns].transpose(1, 2), torch.stack(list(snapshots.values())), rtol=0, atol=0)
