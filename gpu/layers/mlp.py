"""The gated MLP of a decoder block: down(act(gate(x)) * up(x)), gate and up merged into one projection.

Tensor parallelism: gate/up column-parallel (each rank holds its share of the intermediate rows), down
row-parallel, whose all-reduce sums the ranks' outputs; built with `reduces_output` off, the MLP returns this
rank's partial sum instead (an MoE block adds its shared experts' part to the routed experts' and reduces once).
"""

from dataclasses import dataclass

import torch
from torch import nn

from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.activation import SiluAndMul, gated_activation
from gpu.layers.linear import MergedLinear, RowSlice
from gpu.layers.norm import NormInput
from gpu.layers.parallel_linear import RowParallelLinear


@dataclass(frozen=True)
class MLPSpec:
    hidden_size: int
    intermediate_size: int
    activation: str = "silu"  # a config's hidden_act / hidden_activation (gpu/layers/activation.py)
    has_bias: bool = False


class MLP(nn.Module):
    def __init__(self, spec: MLPSpec, kernels: KernelConfig, tp: TensorParallel, reduces_output: bool = True) -> None:
        super().__init__()
        size = spec.intermediate_size
        rows = RowSlice(*tp.split(size, "the MLP's intermediate size"), total=size)
        self.gate_up_proj = MergedLinear(spec.hidden_size, {"gate": rows, "up": rows}, spec.has_bias, kernels)
        self.down_proj = RowParallelLinear(size, spec.hidden_size, spec.has_bias, tp, kernels, reduces_output)
        self.act = gated_activation(spec.activation, kernels)

    def forward(self, x: NormInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP of norm(x + residual), x + residual)."""
        if isinstance(self.act, SiluAndMul) and self.gate_up_proj.fuses_silu_and_mul(x.x):
            activated, residual = self.gate_up_proj.forward_normed_silu_and_mul(x)
            return self.down_proj(activated), residual
        gate_up, residual = self.gate_up_proj.forward_normed(x)
        return self.down_proj.forward_activated(gate_up, self.act), residual

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """The MLP of an input already normed [num_tokens, hidden_size]."""
        return self.down_proj.forward_activated(self.gate_up_proj(normed), self.act)
