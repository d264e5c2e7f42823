"""The tensor-parallel group a model runs in: its rank, its size and the collectives the sharded layers use.

Every collective goes through torch.distributed (NCCL on CUDA, gloo on CPU); nothing here moves a
tensor by other means. At size 1 (`SINGLE`) each collective is the identity and torch.distributed is
never touched, so the single-device path is the same code with no group.

Invariant: every rank of a group calls the same collectives in the same order with tensors of the same
shapes (the ranks run the same batch through the same model), which is what lets CUDA graphs capture
them and replay them on every rank alike.
"""

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None  # None at size 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside a group of {self.size}")
        if self.size > 1 and self.group is None:
            raise ValueError("a tensor-parallel group of more than one rank needs its process group")

    @property
    def is_first(self) -> bool:
        """Rank 0 samples: it alone sees the full-vocabulary logits."""
        return self.rank == 0

    def split(self, total: int, what: str) -> tuple[int, int]:
        """(start, size) of this rank's equal share of `total` rows; `what` names them in the error."""
        if total % self.size:
            raise ValueError(f"{what} ({total}) must be divisible by the tensor-parallel size ({self.size})")
        size = total // self.size
        return self.rank * size, size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums `x` over the ranks, in place; returns it."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: the ranks' `x` side by side along the last dimension, in rank order; other ranks: None."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.is_first else None
        dist.gather(x, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def broadcast_from_first(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` becomes rank 0's, in place; returns it."""
        if self.size > 1:
            dist.broadcast(x, src=0, group=self.group)
        return x

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest of the ranks' `value`s, on every rank."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())


SINGLE = TensorParallel()


def host_store(timeout_s: float) -> dist.TCPStore:
    """The key-value store where the ranks meet, served by the engine's process on a free local port."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def join_group(rank: int, size: int, store_port: int, device: torch.device, timeout_s: float) -> TensorParallel:
    """Joins this process to the group as `rank` (NCCL on CUDA, gloo on CPU), meeting the others at the
    engine's store. A collective that waits longer than `timeout_s` for a peer fails instead of hanging."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timeout)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout, **kwargs)
    return TensorParallel(rank, size, dist.group.WORLD)
