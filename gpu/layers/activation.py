"""SiLU-and-multiply over a merged gate/up projection.

On CUDA, when triton is installed, one Triton kernel (gpu/kernels/silu_and_mul.py) replaces the
chunk, SiLU and product; elsewhere, or with `use_fused_kernels` off, the torch code runs: it is the
reference the kernel is tested against. Triton is imported on the first CUDA call only.
"""

import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

HAS_TRITON = importlib.util.find_spec("triton") is not None


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.use_fused_kernels = True  # cleared to force the torch path on CUDA (tests compare the two)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_fused_kernels and HAS_TRITON and x.is_cuda and x.dim() == 2 and x.stride(1) == 1:
            from gpu.kernels.silu_and_mul import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
