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
