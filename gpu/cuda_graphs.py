"""CUDA graphs for decode-only steps: one graph per padded batch-size bucket, sharing one memory pool.

Each graph reads static input buffers that are filled in place before replay (no allocation per
step) and writes a static hidden-state buffer. With graphs off (`--enforce-eager`) decode steps
still run on these padded static buffers, eagerly: the kernels then see exactly the shapes they
see under a graph, so graphs on and off compute the same numbers. Padded rows write no K/V (slot -1) and attend to one
token of a valid block, so they cost little and never fault; their outputs are ignored. The
attention metadata a graph was captured with is static too: `max_context_len` is `max_model_len`,
so a kernel that sizes its launch from it launches the same grid at every replay.
"""

import logging
from collections.abc import Callable

import torch

from gpu.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (vLLM-like), largest last."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    return sorted(set(buckets + [max_num_seqs]))


class DecodeGraphs:
    def __init__(
        self, forward: ForwardFn, max_num_seqs: int, max_model_len: int, block_size: int, device: torch.device
    ) -> None:
        self.forward = forward
        self.buckets = batch_size_buckets(max_num_seqs)
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        n = max_num_seqs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def bucket_for(self, num_rows: int) -> int | None:
        return next((b for b in self.buckets if b >= num_rows), None)

    def metadata(self, bucket: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            query_start_loc=self.query_start_loc[: bucket + 1],
            context_lens=self.context_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            max_query_len=1,
            max_context_len=self.max_model_len,
            is_decode_only=True,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        for bucket in reversed(self.buckets):  # largest first: later graphs fit in its pool
            args = self._static_args(bucket)
            self.forward(*args)  # warm-up outside the graph: compiles kernels, settles allocations
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[bucket] = self.forward(*args)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bucket] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.buckets)

    def _static_args(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        return self.input_ids[:bucket], self.positions[:bucket], self.metadata(bucket)

    def run(
        self,
        num_rows: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
    ) -> torch.Tensor:
        """Fills the static buffers (device tensors in, already on the GPU), replays the bucket's graph
        (or runs eagerly on the buffers when none was captured); returns [num_rows, hidden_size]."""
        bucket = self.bucket_for(num_rows)
        assert bucket is not None
        self.input_ids[:num_rows].copy_(input_ids)
        self.positions[:num_rows].copy_(positions)
        self.slot_mapping[:num_rows].copy_(slot_mapping)
        self.slot_mapping[num_rows:bucket].fill_(-1)
        self.context_lens[:num_rows].copy_(context_lens)
        self.context_lens[num_rows:bucket].fill_(1)
        self.block_tables[:num_rows, : block_tables.shape[1]].copy_(block_tables)
        if bucket not in self.graphs:
            return self.forward(*self._static_args(bucket))[:num_rows]
        self.graphs[bucket].replay()
        return self.outputs[bucket][:num_rows]
