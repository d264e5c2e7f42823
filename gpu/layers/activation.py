"""Gated activations over a merged gate/up projection: act(gate) * up, for SiLU (Llama, Qwen, Mistral, Phi-3)
and GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).

On CUDA, when triton is installed, one Triton kernel (gpu/kernels/silu_and_mul.py, either activation) replaces
the chunk, activation and product; elsewhere, or built with `KernelConfig.fused_kernels` off, the torch code
runs: it is the reference the kernel is tested against. Triton is imported on the first CUDA call only.
"""

import torch
import torch.nn.functional as F
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON


class GatedActivation(nn.Module):
    activation = "silu"  # the kernel's name for it

    def __init__(self, kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.kernels = kernels

    def is_fused(self, x: torch.Tensor) -> bool:
        """Whether this runs as gpu/kernels/silu_and_mul.py's kernel (a GEMM prologue computes the SiLU one)."""
        return self.kernels.fused_kernels and HAS_TRITON and x.is_cuda and x.dim() == 2 and x.stride(1) == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_fused(x):
            from gpu.kernels.silu_and_mul import gated_activation

            return gated_activation(x, self.activation, use_pdl=True)
        gate, up = x.chunk(2, dim=-1)
        return self.act(gate) * up

    def act(self, gate: torch.Tensor) -> torch.Tensor:
        return F.silu(gate)


class SiluAndMul(GatedActivation):
    pass


class GeluTanhAndMul(GatedActivation):
    activation = "gelu_tanh"

    def act(self, gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh")


# A config's `hidden_act` / `hidden_activation` -> the gated activation over [gate; up].
GATED_ACTIVATIONS: dict[str, type[GatedActivation]] = {
    "silu": SiluAndMul, "swish": SiluAndMul, "gelu_pytorch_tanh": GeluTanhAndMul,
}


def gated_activation(name: str, kernels: KernelConfig = DEFAULT_KERNELS) -> GatedActivation:
    if name not in GATED_ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported (supported: {sorted(GATED_ACTIVATIONS)})")
    return GATED_ACTIVATIONS[name](kernels)


def times_sigmoid(x: torch.Tensor, gate: torch.Tensor, kernels: KernelConfig = DEFAULT_KERNELS) -> torch.Tensor:
    """x * sigmoid(gate) (an output gate), x [num_tokens, groups, size], gate alike or [num_tokens, 1, 1] (one a
    token), in x's dtype: on CUDA with the kernels one launch (gpu/kernels/sigmoid_gate.py), the torch code the
    reference."""
    if kernels.fused_kernels and HAS_TRITON and x.is_cuda:
        from gpu.kernels.sigmoid_gate import sigmoid_gate

        return sigmoid_gate(x, gate, use_pdl=True)
    return x * torch.sigmoid(gate)
