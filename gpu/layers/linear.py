"""Linear layers: `Linear` routes decode-sized inputs to the skinny GEMM kernel; `MergedLinear` stacks
several checkpoint tensors (q/k/v, gate/up) into one weight.

`Linear` sends an input of at most SKINNY_MAX_ROWS rows, bf16/fp16, on CUDA (where triton is installed) to
gpu/kernels/skinny_gemm.py, which streams the weight at a higher share of the memory bandwidth than cuBLAS
does for so few rows, unless the kernel's table says cuBLAS is as fast for that shape; anything else goes to
F.linear. The choice depends on shapes and dtypes only, so it is the same at every replay of a CUDA graph.
A layer built with `KernelConfig.skinny_gemm` off always runs F.linear (tests and A/B runs compare). Merging
turns three (or two) matmuls into one; each parameter of a MergedLinear carries a `weight_loader` that copies one
checkpoint shard into its rows. Under tensor parallelism a MergedLinear is column-parallel: each of its shards
holds a `RowSlice` of its checkpoint tensor (this rank's heads, or its share of the MLP) and reads only those rows.
On a CPU in bfloat16 the runner packs each layer's weight after loading (gpu/layers/cpu_linear.py): `packed` then
replaces `weight`.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON
from gpu.layers.cpu_linear import PackedWeight, pack_weight
from gpu.loader import CheckpointTensor

SKINNY_MAX_ROWS = 16  # the decode graphs' buckets 1, 2, 4, 8, 16; more rows are cuBLAS's GEMM
SKINNY_DTYPES = (torch.bfloat16, torch.float16)


class Linear(nn.Linear):
    def __init__(
        self, in_features: int, out_features: int, bias: bool, kernels: KernelConfig = DEFAULT_KERNELS
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels
        self.packed: PackedWeight | None = None

    def pack_for_cpu(self) -> str:
        """Replaces the weight by its packed form (the weight's memory is freed); returns the form's kind."""
        self.packed = pack_weight(self.weight.detach())
        self.weight = None  # type: ignore[assignment]
        return self.packed.kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x, self.bias)
        if self._is_skinny(x):
            from gpu.kernels.skinny_gemm import skinny_gemm

            rows = x.reshape(-1, self.in_features)
            y = skinny_gemm(rows, self.weight, self.bias, use_pdl=self.kernels.skinny_gemm_pdl)
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)

    def _is_skinny(self, x: torch.Tensor) -> bool:
        if not (self.kernels.skinny_gemm and HAS_TRITON and x.is_cuda and x.dtype in SKINNY_DTYPES
                and x.dtype == self.weight.dtype and 0 < x.numel() <= SKINNY_MAX_ROWS * self.in_features
                and x.stride(-1) == 1 and self.weight.stride(-1) == 1
                and not (torch.is_grad_enabled() and self.weight.requires_grad)):
            return False
        from gpu.kernels.skinny_gemm import preferred_config

        return preferred_config(x.numel() // self.in_features, self.out_features, self.in_features) is not None


@dataclass(frozen=True)
class RowSlice:
    """Rows [start, start + size) of a checkpoint tensor that has `total` rows."""

    start: int
    size: int
    total: int

    @staticmethod
    def whole(total: int) -> "RowSlice":
        return RowSlice(0, total, total)


class MergedLinear(Linear):
    def __init__(self, in_features: int, shards: dict[str, int | RowSlice], bias: bool,
                 kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        """shards: each checkpoint tensor's rows in this layer, in order (a count: all of its rows)."""
        slices = {name: s if isinstance(s, RowSlice) else RowSlice.whole(s) for name, s in shards.items()}
        super().__init__(in_features, sum(s.size for s in slices.values()), bias, kernels)
        self.shard_slices = slices
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, rows in slices.items():
            self.shard_offsets[name] = (start, rows.size)
            start += rows.size
        self.weight.weight_loader = self._load_shard  # type: ignore[attr-defined]
        if bias:
            self.bias.weight_loader = self._load_shard  # type: ignore[attr-defined]

    def _load_shard(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str) -> None:
        start, size = self.shard_offsets[shard]
        rows = self.shard_slices[shard]
        if loaded.shape[0] != rows.total:
            raise ValueError(f"shard {shard!r} has {loaded.shape[0]} rows, expected {rows.total}")
        param.data[start : start + size].copy_(loaded.read_rows(rows.start, rows.size))
