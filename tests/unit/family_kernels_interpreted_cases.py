"""The elementwise Triton kernels in the forms the newer families use, run by Triton's interpreter on the CPU in
float32 against the torch layers they replace: RMSNorm by Gemma 3's and Gemma 4's conventions (with and without a
residual), the per-head q/k norm + RoPE by Gemma's convention, and GELU-tanh-and-mul. tests/gpu/
test_family_kernels.py checks the compiled kernels on CUDA in bf16."""

import os

import pytest
import torch

from gpu.config import KernelConfig
from gpu.layers.activation import GeluTanhAndMul
from gpu.layers.norm import GEMMA3_NORM, GEMMA4_NORM, LLAMA_NORM, NormConvention, RMSNorm

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.qk_norm_rope import qk_norm_rope  # noqa: E402
from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.kernels.silu_and_mul import gated_activation  # noqa: E402

TORCH_LAYERS = KernelConfig(fused_kernels=False)
CONVENTIONS = {"llama": LLAMA_NORM, "gemma3": GEMMA3_NORM, "gemma4": GEMMA4_NORM}


def norm_of(convention: NormConvention, size: int, generator: torch.Generator) -> RMSNorm:
    norm = RMSNorm(size, 1e-6, TORCH_LAYERS, convention)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(size, generator=generator) * 0.3)
    return norm


@pytest.mark.parametrize("has_residual", [False, True])
@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_rms_norm_kernel_by_convention(name: str, has_residual: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    norm = norm_of(CONVENTIONS[name], 48, generator)
    x, residual = torch.randn(2, 5, 48, generator=generator).unbind(0)
    expected, expected_sum = norm.forward_with_residual(x, residual if has_residual else None)
    convention = norm.convention
    got, got_sum = rms_norm(x, norm.weight.detach(), 1e-6, residual if has_residual else None,
                            weight_offset=convention.weight_offset, scales_in_float32=convention.scales_in_float32)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_sum, expected_sum)


def test_gemma3_offset_is_applied() -> None:
    """(1 + w): the offset changes the result (the case above would not pass with the offset dropped)."""
    generator = torch.Generator().manual_seed(2)
    norm = norm_of(GEMMA3_NORM, 16, generator)
    x = torch.randn(3, 16, generator=generator)
    without_offset, _ = rms_norm(x, norm.weight.detach(), 1e-6, scales_in_float32=True)
    assert (norm(x) - without_offset).abs().max() > 0.1


def test_qk_norm_rope_by_gemma_convention() -> None:
    generator = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim, num_tokens = 4, 2, 16, 6
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    positions = torch.randint(0, 32, (num_tokens,), generator=generator)
    angles = torch.rand(32, head_dim // 2, generator=generator) * 6
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    q_norm, k_norm = norm_of(GEMMA3_NORM, head_dim, generator), norm_of(GEMMA3_NORM, head_dim, generator)
    q, k = qk_norm_rope(qkv, positions, cos, sin, (num_heads, num_kv_heads, head_dim),
                        (q_norm.weight.detach(), k_norm.weight.detach()), 1e-6, norm_convention=(1.0, True))

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos[positions, None] + torch.cat((-x2, x1), dim=-1) * sin[positions, None]

    expected_q = rotate(q_norm(qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)))
    keys = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    torch.testing.assert_close(q, expected_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, rotate(k_norm(keys)), atol=1e-5, rtol=1e-5)


def test_gelu_tanh_and_mul_kernel() -> None:
    x = torch.randn(7, 2 * 40, generator=torch.Generator().manual_seed(4)) * 3
    expected = GeluTanhAndMul(TORCH_LAYERS)(x)
    torch.testing.assert_close(gated_activation(x, "gelu_tanh"), expected, atol=1e-5, rtol=1e-5)
