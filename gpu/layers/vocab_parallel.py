"""The token embedding and the LM head, each rank holding one contiguous share of the vocabulary's rows.

Shares are equal, ceil(vocab_size / size) rows each; the last rank's rows past the vocabulary are
zeros and its logits there are cut off. Embedding: each rank looks up the ids that fall in its share
(zeros for the others) and one all-reduce sums the ranks' rows, which gives every rank every token's
row exactly (a row plus zeros). LM head: each rank computes its share's logits and rank 0 gathers them
into the full-vocabulary logits it samples from; the other ranks get None. At size 1 both are the
plain embedding and linear map over the whole vocabulary.
"""

import torch
import torch.nn.functional as F
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.cpu_linear import CpuPacking, PackedWeight
from gpu.layers.linear import linear
from gpu.loader import CheckpointTensor


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.num_local_rows = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * self.num_local_rows
        self.num_real_rows = max(0, min(self.num_local_rows, vocab_size - self.vocab_start))  # the rest is padding
        self.weight = nn.Parameter(torch.empty(self.num_local_rows, hidden_size))  # every row set by the loader
        self.weight.weight_loader = self._load_rows  # type: ignore[attr-defined]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[num_tokens] -> [num_tokens, hidden_size]"""
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local_ids = input_ids - self.vocab_start
        is_mine = (local_ids >= 0) & (local_ids < self.num_real_rows)
        rows = F.embedding(torch.where(is_mine, local_ids, 0), self.weight)
        return self.tp.all_reduce(rows.masked_fill_(~is_mine.unsqueeze(-1), 0.0))

    def _load_rows(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        if loaded.shape != (self.vocab_size, param.shape[1]):
            raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != {(self.vocab_size, param.shape[1])}")
        param.data[: self.num_real_rows].copy_(loaded.read_rows(self.vocab_start, self.num_real_rows))
        param.data[self.num_real_rows :].zero_()


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel,
                 kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        super().__init__(vocab_size, hidden_size, tp)
        self.kernels = kernels  # few rows: the skinny GEMM where its table says (gpu/layers/linear.py's rule)
        self.packed: PackedWeight | None = None  # on a CPU: this share's rows packed (gpu/cpu_packing.py)

    def pack_for_cpu(self, packing: CpuPacking) -> str | None:
        """Packs this share's rows for the CPU's matmul (the weight stays: a tied embedding looks rows up in it);
        returns the packed form's kind, None where the weight stays as it is."""
        self.packed = packing.pack(self.weight.detach())
        return None if self.packed is None else self.packed.kind

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:  # type: ignore[override]
        """[num_rows, hidden_size] -> rank 0: [num_rows, vocab_size] logits; other ranks: None."""
        local = linear(hidden, self.weight, None, self.kernels) if self.packed is None else self.packed(hidden, None)
        logits = self.tp.gather_last_dim(local)
        if logits is None or logits.shape[-1] == self.vocab_size:
            return logits
        return logits[:, : self.vocab_size].contiguous()  # the last rank's padding rows cut off

    def forward_into(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The logits written into `out` [num_rows, vocab_size] (a buffer the caller reuses, e.g. one for every
        decode graph); one GPU, unpacked weight only."""
        assert self.tp.size == 1 and self.packed is None, "forward_into is the single-GPU, unpacked head's"
        return linear(hidden, self.weight, None, self.kernels, out=out)
