"""RMSNorm, optionally fused with the residual add that precedes it.

On CUDA, when triton is installed, both go through one Triton kernel (gpu/kernels/rms_norm.py);
elsewhere, or built with `KernelConfig.fused_kernels` off, the torch code below runs: it is the
reference the kernel is tested against, and it rounds at the same points. The kernel module is imported on the
first CUDA call, so CPU runs never import triton.
"""

from dataclasses import dataclass

import torch
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and self.is_fused(x):
            return self._fused(x, None)[0]
        # Computed in float32 like transformers, so float32 parity is exact and bf16 stays stable.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
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

    def _fused(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        from gpu.kernels.rms_norm import rms_norm

        return rms_norm(x, self.weight, self.eps, residual, use_pdl=True)


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
