"""The skinny GEMM's norm prologue writing its normed input (gpu/kernels/skinny_gemm.py's `normed_out`, what the MoE
block's experts read after its router) under Triton's interpreter, against gpu/kernels/rms_norm.py interpreted too:
fma tiles of 1..8 rows, ragged and even K, split-K, the dot and TMA kernels. Run by
tests/unit/test_skinny_gemm_normed_interpreted.py in a process that has TRITON_INTERPRET=1 from its start (rms_norm's
tl.sum is a jit helper the interpreter patches only then). float16: the interpreter rounds float32 to bfloat16
otherwise than CUDA does (tests/gpu/test_skinny_gemm.py checks bf16)."""

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.kernels.skinny_gemm import SkinnyConfig, skinny_gemm, skinny_gemm_rms_norm  # noqa: E402

# (config, K): fma tiles of 1..8 rows, ragged and even K, split-K; the dot and TMA kernels' prologue too.
PATHS = {
    "ragged": (SkinnyConfig(8, 32, num_stages=1), 100),
    "even-k": (SkinnyConfig(4, 16, num_stages=1), 64),
    "split-ragged": (SkinnyConfig(4, 16, split_k=3, num_stages=1), 70),
    "split-even": (SkinnyConfig(4, 16, split_k=2, num_stages=1), 64),
    "dot": (SkinnyConfig(16, 32, use_dot=True, num_stages=2), 96),
    "tma-split": (SkinnyConfig(16, 32, split_k=2, use_dot=True, num_stages=2, use_tma=True), 64),
}


def norm_inputs(m: int, k: int, seed: int, has_exact_sums: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, residual, norm weight) in float16. `has_exact_sums`: x and residual small integers, so that x + residual
    and the float32 sum of its squares are exact in any order: the norm kernel's rstd and the prologue's are then the
    same number, and their outputs must be equal to the bit (the rounding points alone decide them)."""
    generator = torch.Generator().manual_seed(seed)
    if has_exact_sums:
        x, residual = (torch.randint(-3, 4, (m, k), generator=generator).half() for _ in range(2))
    else:
        x, residual = (torch.randn(m, k, generator=generator).half() for _ in range(2))
    return x, residual, (1 + torch.randn(k, generator=generator) / 4).half()


@pytest.mark.parametrize("has_residual", [True, False])
@pytest.mark.parametrize("path", PATHS)
def test_rms_norm_prologue_writes_the_normed_input_it_multiplied(path: str, has_residual: bool) -> None:
    """`normed_out` holds norm(x + residual) as rms_norm.py rounds it (to the bit where the sums of squares are
    exact; elsewhere a float32 sum in another order may flip a last bit), the product is exactly the plain kernel's
    product of that output on the same config, and asking for it changes neither y nor the sum."""
    config, k = PATHS[path]
    generator = torch.Generator().manual_seed(k)
    w = (torch.randn(13, k, generator=generator) * k**-0.5).half()
    bias = torch.randn(13, generator=generator).half()
    for m in (1, 2, 3, 5, 8):
        for has_exact_sums in (True, False):
            x, res, norm_weight = norm_inputs(m, k, 100 * m + k, has_exact_sums)
            res = res if has_residual else None
            normed = torch.full((m, k), float("nan"), dtype=torch.float16)
            y, summed = skinny_gemm_rms_norm(x, res, norm_weight, 1e-6, w, bias, config, normed_out=normed)
            ref_normed, ref_summed = rms_norm(x, norm_weight, 1e-6, res)
            assert torch.equal(summed, ref_summed)
            if has_exact_sums:
                assert torch.equal(normed, ref_normed), (m, (normed != ref_normed).sum())
            else:
                assert (normed == ref_normed).float().mean().item() >= 0.95
                torch.testing.assert_close(normed, ref_normed, rtol=1e-3, atol=1e-3)
            assert torch.equal(y, skinny_gemm(normed, w, bias, config))
            y_alone, summed_alone = skinny_gemm_rms_norm(x, res, norm_weight, 1e-6, w, bias, config)
            assert torch.equal(y, y_alone) and torch.equal(summed, summed_alone)


def test_normed_out_is_checked() -> None:
    x, w = torch.zeros(2, 16, dtype=torch.float16), torch.zeros(8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="normed_out"):
        skinny_gemm_rms_norm(x, None, torch.ones(16).half(), 1e-6, w, normed_out=torch.empty(2, 16))
    with pytest.raises(ValueError, match="normed_out"):
        skinny_gemm_rms_norm(x, None, torch.ones(16).half(), 1e-6, w, normed_out=torch.empty(16, 2).half().t())
