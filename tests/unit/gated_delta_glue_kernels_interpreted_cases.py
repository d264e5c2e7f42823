"""The hybrids' elementwise kernels under Triton's interpreter on the CPU, against the torch code they replace: the
Gated DeltaNet's gated output norm (gpu/kernels/gated_rms_norm.py) and decay and write strength
(gpu/kernels/gated_delta_gates.py), and the output gates of the gated attention and the shared experts
(gpu/kernels/sigmoid_gate.py), in bf16 and fp16, odd head counts and sizes, one token and more.

Bit for bit where the math library agrees: the interpreter runs numpy's exp (and log1p in float64), which differ
from torch's CPU ones in the last bit or two of a float32 for many inputs (not the kernels' doing: compiled, they call
the libdevice functions torch's CUDA kernels call). So the exact cases draw their transcendental inputs where both
libraries give the same float32, and other cases bound the ulps over any input. tests/gpu/test_gated_deltanet_gpu.py
checks the compiled kernels on CUDA."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpu.config import KernelConfig
from gpu.layers.gated_deltanet import GatedRMSNorm
from tests.ulps import ulps

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.gated_delta_gates import gated_delta_gates  # noqa: E402
from gpu.kernels.gated_rms_norm import gated_rms_norm  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16]
EPS = 1e-6
# (tokens, heads, head_dim): one token, odd counts and sizes, the real head size
NORM_SHAPES = [(1, 3, 40), (5, 4, 128), (17, 1, 24), (2, 5, 7)]



def numpy_silu(x: torch.Tensor) -> torch.Tensor:
    """silu in float32 with the interpreter's exp: what the kernel computes under it."""
    values = x.numpy()
    return torch.from_numpy(values / (np.float32(1) + np.exp(-values)))


def gate_where_silu_agrees(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """A gate of `shape` in `dtype`, drawn again wherever numpy's silu and torch's differ."""
    gate = (torch.randn(shape, generator=generator) * 3).to(dtype)
    while True:
        differs = numpy_silu(gate.float()) != F.silu(gate.float())
        if not differs.any():
            return gate
        gate[differs] = (torch.randn(int(differs.sum()), generator=generator) * 3).to(dtype)


def norm_inputs(shape: tuple[int, int, int], dtype: torch.dtype, generator: torch.Generator, exact: bool
                ) -> tuple[torch.Tensor, torch.Tensor, GatedRMSNorm]:
    """(x float32, gate: a strided view as the projection's z columns are, the torch layer with a random weight)."""
    num_tokens, num_heads, head_dim = shape
    x = torch.randn(shape, generator=generator) * 2
    projected = torch.randn(num_tokens, num_heads * head_dim + 5, generator=generator).to(dtype)
    gate = projected[:, 3 : 3 + num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    if exact:
        gate.copy_(gate_where_silu_agrees(shape, dtype, generator))
    norm = GatedRMSNorm(head_dim, EPS, KernelConfig(fused_kernels=False))
    with torch.no_grad():
        norm.weight.copy_(torch.randn(head_dim, generator=generator) * 0.5 + 1)
    return x, gate, norm.to(dtype)


@pytest.mark.parametrize("shape", NORM_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_norm_is_the_torch_norm_bit_for_bit(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    """From the delta rule's float32 output, and from one already in the activations' dtype (fla's)."""
    x, gate, norm = norm_inputs(shape, dtype, torch.Generator().manual_seed(sum(shape)), exact=True)
    with torch.no_grad():
        expected = norm(x, gate)
        for given in (x, x.to(dtype)):
            got = gated_rms_norm(given, gate, norm.weight, EPS)
            assert got.dtype == dtype and torch.equal(got, expected), int((got != expected).sum())


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_norm_with_any_gate_is_within_an_ulp(dtype: torch.dtype) -> None:
    """Over gates where numpy's silu differs from torch's in the last float32 bits, a rare output lands on the other
    side of a rounding: one ulp of the dtype at most."""
    x, gate, norm = norm_inputs((64, 4, 128), dtype, torch.Generator().manual_seed(7), exact=False)
    with torch.no_grad():
        expected = norm(x, gate)
    got = gated_rms_norm(x, gate, norm.weight, EPS)
    differ = ulps(got, expected)
    assert differ.max() <= 1 and (differ > 0).float().mean() < 1e-2


def test_norm_inputs_tell_each_rounding_apart() -> None:
    """The exact cases would catch a kernel that skipped any of the torch path's roundings: on their inputs, the norm
    computed without each one differs from the norm."""
    dtype = torch.bfloat16
    x, gate, norm = norm_inputs((5, 4, 128), dtype, torch.Generator().manual_seed(9), exact=True)
    weight = norm.weight.detach().float()

    def variant(round_x: bool, round_normed: bool, round_scaled: bool) -> torch.Tensor:
        inputs = x.to(dtype).float() if round_x else x
        normed = inputs * torch.rsqrt(inputs.pow(2).mean(-1, keepdim=True) + EPS)
        normed = normed.to(dtype).float() if round_normed else normed
        scaled = weight * normed
        scaled = scaled.to(dtype).float() if round_scaled else scaled
        return (scaled * F.silu(gate.float())).to(dtype)

    with torch.no_grad():
        assert torch.equal(variant(True, True, True), norm(x, gate))
    for skipped in range(3):
        assert not torch.equal(variant(*(index != skipped for index in range(3))), norm(x, gate)), skipped


def torch_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's torch code (GatedDeltaNet._gates off CUDA)."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias), b.sigmoid()


def numpy_softplus(x: torch.Tensor) -> torch.Tensor:
    """softplus in float32 with the interpreter's exp and log1p: what the kernel computes under it."""
    values = x.numpy()
    log1p = np.log(1.0 + np.exp(values).astype(np.float64)).astype(np.float32)
    return torch.from_numpy(np.where(values > 20, values, log1p))


def gates_inputs(num_tokens: int, num_heads: int, dtype: torch.dtype, generator: torch.Generator, exact: bool
                 ) -> tuple[torch.Tensor, ...]:
    """(a, b: column slices of one projection output, A_log, dt_bias) in `dtype`, with inputs far past softplus's
    threshold (where exp overflows), at it and far below; where `exact`, drawn again wherever numpy's math and torch's
    differ."""
    projected = torch.randn(num_tokens, 2 * num_heads + 3, generator=generator) * 4
    projected[0, 2 + num_heads] = 100.0
    projected = projected.to(dtype)
    a, b = projected[:, 2 + num_heads : 2 + 2 * num_heads], projected[:, 1 : 1 + num_heads]
    a_log = (torch.rand(num_heads, generator=generator) * 3 - 1).to(dtype)
    dt_bias = (torch.rand(num_heads, generator=generator) * 2).to(dtype)
    if num_heads > 1:
        dt_bias[1] = 1.0
        a[0, 1] = 19.0  # a + dt_bias exactly at the threshold: log1p(exp(20)) (20 in float32 as well)
    if exact:
        while (differs := torch.from_numpy(np.exp(a_log.float().numpy())) != a_log.float().exp()).any():
            a_log[differs] = (torch.rand(int(differs.sum()), generator=generator) * 3 - 1).to(dtype)
        while (differs := numpy_softplus(a.float() + dt_bias) != F.softplus(a.float() + dt_bias)).any():
            a[differs] = (torch.randn(int(differs.sum()), generator=generator) * 4).to(dtype)
        while (differs := torch.from_numpy(1 / (1 + np.exp(-b.float().numpy()))).to(dtype) != b.sigmoid()).any():
            b[differs] = (torch.randn(int(differs.sum()), generator=generator) * 4).to(dtype)
    return a, b, a_log, dt_bias


@pytest.mark.parametrize(("num_tokens", "num_heads"), [(1, 3), (7, 32), (40, 5), (3, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gates_are_the_torch_gates_bit_for_bit(dtype: torch.dtype, num_tokens: int, num_heads: int) -> None:
    a, b, a_log, dt_bias = gates_inputs(num_tokens, num_heads, dtype, torch.Generator().manual_seed(num_tokens),
                                        exact=True)
    expected_g, expected_beta = torch_gates(a, b, a_log, dt_bias)
    g, beta = gated_delta_gates(a, b, a_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype
    assert torch.equal(g, expected_g), int((g != expected_g).sum())
    assert torch.equal(beta, expected_beta), int((beta != expected_beta).sum())
    past_threshold = a[0, 0].float() + dt_bias[0].float()  # softplus is its input there, not log1p(inf)
    assert past_threshold > 89 and g[0, 0] == -a_log[0].float().exp() * past_threshold


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
def test_gates_over_any_input_are_within_a_few_ulps(dtype: torch.dtype) -> None:
    """numpy's exp against torch's CPU one (up to 2 ulps apart, in two exps and a log1p of one, then a product): g
    (float32) within 6 ulps; beta within one ulp of bf16 or fp16 (rounding hides the rest), 6 of float32."""
    a, b, a_log, dt_bias = gates_inputs(256, 32, dtype, torch.Generator().manual_seed(11), exact=False)
    expected_g, expected_beta = torch_gates(a, b, a_log, dt_bias)
    g, beta = gated_delta_gates(a, b, a_log, dt_bias)
    assert ulps(g, expected_g).max() <= 6
    assert ulps(beta, expected_beta).max() <= (6 if dtype == torch.float32 else 1)


def gate_where_sigmoid_agrees(gate: torch.Tensor, generator: torch.Generator) -> None:
    """Draws `gate` again (in place) wherever numpy's sigmoid, rounded to its dtype, differs from torch's."""
    while True:
        values = gate.float().numpy()
        ours = torch.from_numpy(np.float32(1) / (np.float32(1) + np.exp(-values))).to(gate.dtype)
        differs = ours != torch.sigmoid(gate)
        if not differs.any():
            return
        gate[differs] = (torch.randn(int(differs.sum()), generator=generator) * 3).to(gate.dtype)


@pytest.mark.parametrize(("num_tokens", "num_heads", "head_dim"), [(1, 3, 40), (6, 4, 128), (2, 1, 1100)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_gate_is_the_torch_gate_bit_for_bit(dtype: torch.dtype, num_tokens: int, num_heads: int,
                                                     head_dim: int) -> None:
    """The gated attention's form (a gate per element, the gate columns of q_proj's [query; gate] per head) and the
    shared experts' (one gate a token), against x * torch.sigmoid(gate)."""
    from gpu.kernels.sigmoid_gate import sigmoid_gate

    generator = torch.Generator().manual_seed(num_tokens * head_dim)
    x = (torch.randn(num_tokens, num_heads, head_dim, generator=generator) * 3).to(dtype)
    query_gate = (torch.randn(num_tokens, num_heads, 2 * head_dim, generator=generator) * 3).to(dtype)
    per_element = query_gate[..., head_dim:]
    per_token = (torch.randn(num_tokens, 1, 1, generator=generator) * 3).to(dtype)
    for gate in (per_element, per_token):
        gate_where_sigmoid_agrees(gate, generator)
        expected = x * torch.sigmoid(gate)
        got = sigmoid_gate(x, gate)
        assert torch.equal(got, expected), int((got != expected).sum())
        unrounded = (x.float() * torch.sigmoid(gate.float())).to(dtype)  # the sigmoid's rounding skipped
        assert not torch.equal(unrounded, expected)
