"""Linear layers whose weight is several checkpoint tensors stacked (q/k/v, gate/up).

Merging them turns three (or two) matmuls into one. Each parameter carries a `weight_loader`
that copies one checkpoint shard into its rows.
"""

import torch
from torch import nn


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shard_sizes.items():
            self.shard_offsets[name] = (start, size)
            start += size
        self.weight.weight_loader = self._load_shard  # type: ignore[attr-defined]
        if bias:
            self.bias.weight_loader = self._load_shard  # type: ignore[attr-defined]

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: str) -> None:
        start, size = self.shard_offsets[shard]
        if loaded.shape[0] != size:
            raise ValueError(f"shard {shard!r} has {loaded.shape[0]} rows, expected {size}")
        param.data[start : start + size].copy_(loaded)
