"""The linear layers' state cache (gpu/state_cache.py's `allocate` and `copy_rows`): every layer's states of a kind
in one stacked tensor, each layer's a view of it, so a step's row copies (snapshot restores and saves) are one gather
and one scatter per kind whatever the number of layers, and copy each layer's own rows."""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpu.layers.gated_deltanet import GatedDeltaNet
from gpu.state_cache import StackedStates, allocate, bytes_per_slot, copy_rows
from tests.unit.test_gated_deltanet_layer import SPEC

CPU = torch.device("cpu")


class CountedOps(TorchDispatchMode):
    """Counts the aten operations run under it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def filled_layers(num_layers: int, num_rows: int) -> tuple[list[GatedDeltaNet], StackedStates]:
    """`num_layers` layers with stacked states of `num_rows` rows, each layer's values its own (random)."""
    layers = [GatedDeltaNet(SPEC) for _ in range(num_layers)]
    states = allocate(layers, num_rows, torch.bfloat16, CPU)
    generator = torch.Generator().manual_seed(num_layers)
    for layer in layers:  # written through the layers' views, as the layers write them
        layer.conv_state.copy_(torch.randn(layer.conv_state.shape, generator=generator))
        layer.recurrent_state.copy_(torch.randn(layer.recurrent_state.shape, generator=generator))
    return layers, states


def test_each_layer_holds_views_of_the_stacked_states() -> None:
    layers = [GatedDeltaNet(SPEC) for _ in range(3)]
    states = allocate(layers, 5, torch.bfloat16, CPU)
    assert states.conv.shape == (3, 5, SPEC.conv_dim, SPEC.conv_kernel_size - 1)
    assert states.recurrent.shape == (3, 5, SPEC.num_value_heads, SPEC.key_head_dim, SPEC.value_head_dim)
    assert states.conv.dtype == torch.bfloat16 and states.recurrent.dtype == torch.float32
    assert not states.conv.any() and not states.recurrent.any()
    for index, layer in enumerate(layers):
        assert layer.conv_state.is_contiguous() and layer.recurrent_state.is_contiguous()  # as the kernels need
        layer.conv_state[index + 1] = 1.0
        layer.recurrent_state[index + 1] = 2.0
    for index in range(3):
        assert states.conv[index].count_nonzero() == SPEC.conv_dim * (SPEC.conv_kernel_size - 1)
        assert (states.conv[index, index + 1] == 1.0).all() and (states.recurrent[index, index + 1] == 2.0).all()
    element_bytes = states.conv[0, 0].numel() * 2 + states.recurrent[0, 0].numel() * 4
    assert bytes_per_slot(layers, torch.bfloat16) == 3 * element_bytes


def test_copy_rows_copies_every_layers_own_rows() -> None:
    """Sources are read before any destination is written: (1 -> 2, 2 -> 3) gives row 3 row 2's old state."""
    layers, states = filled_layers(3, 6)
    before = [(layer.conv_state.clone(), layer.recurrent_state.clone()) for layer in layers]
    copy_rows(states, [(1, 2), (2, 3), (0, 5)], CPU)
    for layer, (conv, recurrent) in zip(layers, before, strict=True):
        for source, destination in ((1, 2), (2, 3), (0, 5)):
            assert torch.equal(layer.conv_state[destination], conv[source])
            assert torch.equal(layer.recurrent_state[destination], recurrent[source])
        for untouched in (0, 1, 4):
            assert torch.equal(layer.conv_state[untouched], conv[untouched])
            assert torch.equal(layer.recurrent_state[untouched], recurrent[untouched])


@pytest.mark.parametrize("num_layers", [1, 4])
def test_copy_rows_is_one_gather_and_one_scatter_per_kind_for_all_layers(num_layers: int) -> None:
    layers, states = filled_layers(num_layers, 4)
    with CountedOps() as ops:
        copy_rows(states, [(0, 1), (2, 3)], CPU)
    assert ops.counts["index_select"] == 2 and ops.counts["index_copy_"] == 2, ops.counts
    assert sum(ops.counts.values()) <= 6, ops.counts  # and the indices' copy to the device, nothing per layer


def test_no_states_or_no_copies_copy_nothing() -> None:
    layers, states = filled_layers(2, 3)
    with CountedOps() as ops:
        copy_rows(states, [], CPU)
        copy_rows(None, [(0, 1)], CPU)
    assert not ops.counts


def test_layers_of_different_shapes_are_refused() -> None:
    from dataclasses import replace

    layers = [GatedDeltaNet(SPEC), GatedDeltaNet(replace(SPEC, num_value_heads=2))]
    with pytest.raises(ValueError, match="one shape"):
        allocate(layers, 2, torch.bfloat16, CPU)
