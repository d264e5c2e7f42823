"""The Gated DeltaNet layer's torch paths (the CPU's, and the reference on CUDA): a step of one-token rows and longer
ones runs in two parts (the one-token rows at once, the others row by row) with the results of running every row
by itself; a row cut where a snapshot is saved computes what it computes whole, and the snapshot holds the state the
row's first tokens leave, as running only those tokens leaves it."""

import torch

from gpu.batch import Batch
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.layers.gated_deltanet import DeltaNetSpec, GatedDeltaNet
from gpu.state_cache import step_inputs

SPEC = DeltaNetSpec(hidden_size=32, num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=8,
                    conv_kernel_size=4, norm_eps=1e-6, has_fused_projections=False)


def make_layer(kernels: KernelConfig = DEFAULT_KERNELS, state_rows: int = 8) -> GatedDeltaNet:
    """The same random layer whatever its kernels, with `state_rows` random state rows."""
    torch.manual_seed(0)
    layer = GatedDeltaNet(SPEC, kernels)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.3)
    layer.conv_state = torch.randn(state_rows, SPEC.conv_dim, 3)
    layer.recurrent_state = torch.randn(state_rows, 4, 8, 8)
    return layer


def run(layer: GatedDeltaNet, query_lens: list[int], continues: list[bool], slots: list[int],
        saves: list[tuple[int, int, int]], inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    num_tokens = sum(query_lens)
    batch = Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[0] * num_tokens,
                  query_lens=query_lens, context_lens=[n + c for n, c in zip(query_lens, continues, strict=True)],
                  block_tables=[[0]] * len(query_lens), state_slots=slots, state_saves=saves)
    state = step_inputs(batch, torch.device("cpu"), 8)
    return layer._convolved_rule(*inputs, state)


def test_saves_inside_rows_hold_the_state_of_the_tokens_before() -> None:
    generator = torch.Generator().manual_seed(1)
    query_lens = [70, 1, 30]
    num_tokens = sum(query_lens)
    inputs = (torch.randn(num_tokens, SPEC.conv_dim, generator=generator),
              -torch.rand(num_tokens, 4, generator=generator), torch.rand(num_tokens, 4, generator=generator))
    whole, cut = make_layer(), make_layer()
    expected = run(whole, query_lens, [True, True, False], [0, 1, 2], [], inputs)
    got = run(cut, query_lens, [True, True, False], [0, 1, 2], [(0, 50, 5), (2, 10, 6), (2, 20, 7)], inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cut.recurrent_state[:3], whole.recurrent_state[:3], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cut.conv_state[:3], whole.conv_state[:3])
    # Row 2 (slot 2, from zeros) cut after 10 tokens: its snapshot is the state of running its first 10 alone.
    alone = make_layer()
    first = tuple(x[71:81] for x in inputs)
    run(alone, [10], [False], [2], [], first)
    torch.testing.assert_close(cut.recurrent_state[6], alone.recurrent_state[2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cut.conv_state[6], alone.conv_state[2])


def test_a_mixed_step_runs_in_two_parts_as_rows_alone() -> None:
    generator = torch.Generator().manual_seed(2)
    query_lens, continues, slots = [1, 40, 1, 1, 7], [True, True, False, True, False], [3, 0, 4, 1, 2]
    num_tokens = sum(query_lens)
    inputs = (torch.randn(num_tokens, SPEC.conv_dim, generator=generator),
              -torch.rand(num_tokens, 4, generator=generator), torch.rand(num_tokens, 4, generator=generator))
    together = make_layer()
    got = run(together, query_lens, continues, slots, [], inputs)
    alone = make_layer()
    start = 0
    for num, keeps, slot in zip(query_lens, continues, slots, strict=True):
        expected = run(alone, [num], [keeps], [slot], [], tuple(x[start : start + num] for x in inputs))
        torch.testing.assert_close(got[start : start + num], expected, rtol=1e-4, atol=1e-4)
        start += num
    torch.testing.assert_close(together.recurrent_state, alone.recurrent_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together.conv_state, alone.conv_state)
