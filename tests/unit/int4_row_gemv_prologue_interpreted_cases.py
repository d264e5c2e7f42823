"""Cases for the W4A16 row GEMV's prologues (gpu/kernels/int4_row_gemv.py: `int4_row_gemv_rms_norm`,
`int4_row_gemv_silu_and_mul`) under Triton's interpreter, run by tests/unit/test_int4_row_gemv_interpreted.py in a
process with TRITON_INTERPRET=1: each against the unfused path it replaces, the elementwise kernel
(gpu/kernels/rms_norm.py, silu_and_mul.py) then the plain row GEMV, with zero points per group and one for all, groups
of 32 and 128 columns, K of whole tiles and not, and prologue outputs from tiny to past float16's range (the GEMV
scales x per 32 columns by a power of two into float16: what the prologue makes must go through it too)."""

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.int4_row_gemv import (  # noqa: E402
    GemvTiles,
    int4_row_gemv,
    int4_row_gemv_rms_norm,
    int4_row_gemv_silu_and_mul,
    takes_row_gemv,
)
from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.kernels.silu_and_mul import silu_and_mul  # noqa: E402
from gpu.quant.int_weights import IntGroups, IntWeight, to_kernel_form  # noqa: E402

N = 13  # rows past the last whole tile of 4
TILES = GemvTiles(1, 4, 256, 2)


def _weight(group: int, kind: str, k: int, dtype: torch.dtype, seed: int) -> IntWeight:
    g = torch.Generator().manual_seed(seed)
    levels = torch.randint(0, 16, (N, k), generator=g, dtype=torch.int32)
    scales = torch.rand(N, k // group, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 16, scales.shape, generator=g).float() if kind == "zeros" else None
    stored = to_kernel_form(IntGroups(4, levels, scales, zeros), dtype)
    assert (stored.zeros is not None) == (kind == "zeros")
    return stored


def _assert_close(y: torch.Tensor, reference: torch.Tensor) -> None:
    """float32 outputs of the same kernel on inputs a rounding apart at most (the norm's sum of squares in another
    order): within 1e-3 of the largest output."""
    assert y.isfinite().all() and reference.abs().max() > 0
    assert ((y - reference).abs().max() / reference.abs().max()).item() < 1e-3, (y, reference)


CASES = [  # (group, kind, K, dtype, magnitude of the prologue's output)
    (128, "symmetric", 512, torch.bfloat16, 1.0), (128, "zeros", 512, torch.bfloat16, 1e4),
    (32, "zeros", 480, torch.bfloat16, 1e-6), (32, "symmetric", 512, torch.bfloat16, 3e30),
    (128, "zeros", 384, torch.float16, 1.0), (32, "symmetric", 512, torch.float16, 1e-4)]


@pytest.mark.parametrize("has_residual", [True, False])
@pytest.mark.parametrize(("group", "kind", "k", "dtype", "magnitude"), CASES)
def test_rms_norm_prologue_equals_the_norm_then_the_gemv(group: int, kind: str, k: int, dtype: torch.dtype,
                                                         magnitude: float, has_residual: bool) -> None:
    """norm(x + residual) @ W.T in one launch is the norm kernel's output through the row GEMV, and x + residual
    comes back bit for bit; the norm weight sets the normed x's magnitude."""
    stored = _weight(group, kind, k, dtype, k + group)
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(1, k, generator=g) * 3).to(dtype)
    residual = torch.randn(1, k, generator=g).to(dtype) if has_residual else None
    norm_weight = (torch.randn(k, generator=g) * magnitude).to(dtype)
    assert takes_row_gemv(stored, x)
    y = torch.zeros(1, N)
    summed = int4_row_gemv_rms_norm(x, residual, norm_weight, 1e-6, stored, None, y, TILES, False)
    normed, reference_sum = rms_norm(x, norm_weight, 1e-6, residual)
    reference = torch.zeros(1, N)
    int4_row_gemv(normed, stored, None, reference, TILES, False)
    assert torch.equal(summed, reference_sum)
    _assert_close(y, reference)


@pytest.mark.parametrize(("group", "kind", "k", "dtype", "magnitude"), CASES)
def test_silu_and_mul_prologue_equals_the_activation_then_the_gemv(group: int, kind: str, k: int, dtype: torch.dtype,
                                                                   magnitude: float) -> None:
    """(silu(gate) * up) @ W.T in one launch is the activation kernel's output through the row GEMV, with a bias;
    up sets the activation's magnitude."""
    stored = _weight(group, kind, k, dtype, 3 * k + group)
    g = torch.Generator().manual_seed(k + 1)
    gate_up = torch.cat([torch.randn(1, k, generator=g) * 4, torch.randn(1, k, generator=g) * magnitude], 1).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype) * (magnitude if magnitude < 65504 else 1.0)
    assert takes_row_gemv(stored, gate_up[:, :k])
    y = torch.zeros(1, N)
    int4_row_gemv_silu_and_mul(gate_up, stored, bias, y, TILES, False)
    reference = torch.zeros(1, N)
    int4_row_gemv(silu_and_mul(gate_up), stored, bias, reference, TILES, False)
    _assert_close(y, reference)
