"""SiLU-and-multiply over a merged gate/up projection.

On CUDA, when triton is installed, one Triton kernel (gpu/kernels/silu_and_mul.py) replaces the
chunk, SiLU and product; elsewhere, or built with `KernelConfig.fused_kernels` off, the torch code runs: it is
the reference the kernel is tested against. Triton is imported on the first CUDA call only.
"""

import torch
import torch.nn.functional as F
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON


class SiluAndMul(nn.Module):
    def __init__(self, kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.kernels = kernels

    def is_fused(self, x: torch.Tensor) -> bool:
        """Whether this runs as gpu/kernels/silu_and_mul.py's kernel (a GEMM prologue computes that one)."""
        return self.kernels.fused_kernels and HAS_TRITON and x.is_cuda and x.dim() == 2 and x.stride(1) == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_fused(x):
            from gpu.kernels.silu_and_mul import silu_and_mul

            return silu_and_mul(x, use_pdl=True)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
