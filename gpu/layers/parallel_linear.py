"""The row-parallel linear layer: the input features split over the ranks, the partial outputs summed.

Attention's output projection and the MLP's down projection take the per-rank halves that the
column-parallel layers before them (a MergedLinear holding this rank's rows) produced, so no
communication happens between the two; one all-reduce after this layer restores the full output on
every rank. The bias is added once: rank 0 holds the checkpoint's bias, every other rank zeros.
At tensor-parallel size 1 this is a plain `Linear` that reads the whole checkpoint tensor. Built with
`reduces_output` off, the layer returns this rank's partial sum and the caller reduces it (once, with others).
"""

import torch
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.linear import Linear
from gpu.loader import CheckpointTensor
from gpu.quant.layout import ColumnSlice, RowSlice, WeightLayout


class RowParallelLinear(Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel,
                 kernels: KernelConfig = DEFAULT_KERNELS, reduces_output: bool = True) -> None:
        input_start, local_in = tp.split(in_features, f"the input features of a projection to {out_features}")
        super().__init__(local_in, out_features, bias, kernels)
        self.tp = tp
        self.reduces_output = reduces_output
        self.input_start = input_start
        self.full_in_features = in_features
        self.weight.weight_loader = self._load_weight  # type: ignore[attr-defined]
        if bias:
            self.bias.weight_loader = self._load_bias  # type: ignore[attr-defined]

    def weight_layout(self) -> WeightLayout:
        """This rank's columns of the whole checkpoint tensor."""
        return WeightLayout({None: RowSlice.whole(self.out_features)},
                            ColumnSlice(self.input_start, self.in_features, self.full_in_features))

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(y) if self.reduces_output else y

    def _load_weight(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        if loaded.shape != (self.out_features, self.full_in_features):
            raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != "
                             f"{(self.out_features, self.full_in_features)}")
        param.data.copy_(loaded.read_columns(self.input_start, self.in_features))

    def _load_bias(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        if loaded.shape != (self.out_features,):
            raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != {(self.out_features,)}")
        if self.tp.is_first:
            param.data.copy_(loaded.read())
        else:
            param.data.zero_()  # the all-reduce adds rank 0's bias once
