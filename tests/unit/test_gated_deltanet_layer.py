"""The Gated DeltaNet layer's row-by-row path (the CPU's, and the reference on CUDA) with states saved inside rows:
a row cut where a snapshot is saved computes what it computes whole, and the snapshot holds the state the row's
first tokens leave, as running only those tokens leaves it."""

import torch

from gpu.batch import Batch
from gpu.layers.gated_deltanet import DeltaNetSpec, GatedDeltaNet
from gpu.model_runner import linear_state_inputs

SPEC = DeltaNetSpec(hidden_size=32, num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=8,
                    conv_kernel_size=4, norm_eps=1e-6, has_fused_projections=False)


def make_layer() -> GatedDeltaNet:
    torch.manual_seed(0)
    layer = GatedDeltaNet(SPEC)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.3)
    layer.conv_state = torch.randn(8, SPEC.conv_dim, 3)
    layer.recurrent_state = torch.randn(8, 4, 8, 8)
    return layer


def run(layer: GatedDeltaNet, query_lens: list[int], continues: list[bool], slots: list[int],
        saves: list[tuple[int, int, int]], inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    num_tokens = sum(query_lens)
    batch = Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[0] * num_tokens,
                  query_lens=query_lens, context_lens=[n + c for n, c in zip(query_lens, continues, strict=True)],
                  block_tables=[[0]] * len(query_lens), state_slots=slots, state_saves=saves)
    state = linear_state_inputs(batch, torch.device("cpu"), 8)
    qkv, g, beta = inputs
    return layer._rows(layer._convolved_rows(qkv, state), g, beta, state)


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
