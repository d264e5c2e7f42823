"""RMSNorm, optionally fused with the residual add that precedes it.

Families apply the weight two ways (`NormConvention`): Llama's rounds the normalized value to the model dtype
and multiplies it by the weight; Gemma's multiplies in float32 and rounds once, and Gemma 3 stores w for a
scale of (1 + w) (`weight_offset`). Gemma 4's value norm has no weight at all (`has_weight` off).

On CUDA, when triton is installed, the add and the norm go through one Triton kernel (gpu/kernels/rms_norm.py,
either convention); elsewhere, or built with `KernelConfig.fused_kernels` off, the torch code below runs:
it is the reference the kernel is tested against, and it rounds at the same points. The kernel module is
imported on the first CUDA call, so CPU runs never import triton.
"""

from dataclasses import dataclass

import torch
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON


@dataclass(frozen=True)
class NormConvention:
    """How a family applies an RMSNorm's weight, as its transformers code does."""

    weight_offset: float = 0.0  # the scale is weight_offset + weight (Gemma 3: 1 + w)
    scales_in_float32: bool = False  # Gemma: normed * scale in float32, rounded once; Llama: normed rounded first


LLAMA_NORM = NormConvention()
GEMMA3_NORM = NormConvention(weight_offset=1.0, scales_in_float32=True)
GEMMA4_NORM = NormConvention(scales_in_float32=True)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, kernels: KernelConfig = DEFAULT_KERNELS,
                 convention: NormConvention = LLAMA_NORM, has_weight: bool = True) -> None:
        super().__init__()
        self.eps = eps
        # Without a weight (a plain normalization) the scale is one: a buffer, so no checkpoint tensor is expected.
        if has_weight:
            self.weight = nn.Parameter(torch.ones(hidden_size))
        else:
            self.register_buffer("weight", torch.ones(hidden_size), persistent=False)
        self.convention = NormConvention(0.0, convention.scales_in_float32) if not has_weight else convention
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and self.is_fused(x):
            return self._fused(x, None)[0]
        # Computed in float32 like transformers, so float32 parity is exact and bf16 stays stable.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.convention.scales_in_float32:
            return (x * (self.convention.weight_offset + self.weight.float())).to(dtype)
        return self.weight * x.to(dtype)

    def forward_with_residual(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual): the residual stream for the next block."""
        if x.dim() == 2 and self.is_fused(x):
            return self._fused(x, residual)
        if residual is not None:
            x = x + residual
        return self(x), x

    def is_fused(self, x: torch.Tensor) -> bool:
        """Whether this norm of x runs as gpu/kernels/rms_norm.py's kernel (a GEMM prologue computes that one)."""
        return (self.kernels.fused_kernels and HAS_TRITON and x.is_cuda and x.stride(-1) == 1
                and x.dtype == self.weight.dtype)

    @property
    def is_llama_style(self) -> bool:
        """Llama's convention: the one the skinny GEMM's norm prologue computes (gpu/layers/linear.py)."""
        return self.convention == LLAMA_NORM

    def _fused(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        from gpu.kernels.rms_norm import rms_norm

        return rms_norm(x, self.weight, self.eps, residual, use_pdl=True,
                        weight_offset=self.convention.weight_offset,
                        scales_in_float32=self.convention.scales_in_float32)


@dataclass(frozen=True)
class NormInput:
    """A block's input not normed yet: norm(x + residual), or norm(x) without a residual. A linear layer that
    reads it may compute the norm inside its product (gpu/layers/linear.py); `compute` runs it on its own."""

    norm: RMSNorm
    x: torch.Tensor
    residual: torch.Tensor | None

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the block's input and the residual stream after it."""
        return self.norm.forward_with_residual(self.x, self.residual)
