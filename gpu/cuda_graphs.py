"""CUDA graphs for decode-only steps: one graph per padded batch-size bucket, sharing one memory pool.

Each graph reads static input buffers that are filled in place before replay (no allocation per
step) and writes a static hidden-state buffer. With graphs off (`--enforce-eager`) decode steps
still run on these padded static buffers, eagerly: the kernels then see exactly the shapes they
see under a graph, so graphs on and off compute the same numbers. Padded rows write no K/V (slot -1) and attend to one
token of a valid block, so they cost little and never fault; their outputs are ignored. The
attention metadata a graph was captured with is static too: `max_context_len` is `max_model_len`,
so a kernel that sizes its launch from it launches the same grid at every replay.

The static buffers are views of two device tensors (int64: token ids, positions, slots and the
fed-back token indices; int32: context lengths, the rows' launch order and block tables), filled from
pinned host mirrors with two copies a step, instead of a copy and a device-side scatter per input.
The launch order (rows by descending context, sorted on the host) lets the decode attention kernel
start the longest rows first, so the step does not end on a few long rows started last.
"""

import logging
from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from gpu.attention.metadata import AttentionMetadata
from gpu.batch import Batch
from gpu.host_to_device import write_block_tables
from gpu.pending_step import feed_back_tokens

logger = logging.getLogger(__name__)

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
StaticArgs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata]  # a forward's arguments, static buffers' views
MemoryPool = tuple[int, int]  # CUDAGraph.pool()'s handle


def capture_graphs(forward: ForwardFn, buckets: list[int], static_args: Callable[[int], StaticArgs],
                   pool: MemoryPool | None, desc: str,
                   ) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor], MemoryPool | None]:
    """One graph of `forward` per bucket on the bucket's static args, largest first so that later graphs fit
    in its memory, all in one pool (`pool`, or a new one); returns the graphs, their static outputs and the
    pool. Used for decode steps here and for steps with prefill (mixed_graphs.py)."""
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, torch.Tensor] = {}
    for bucket in tqdm(list(reversed(buckets)), desc=desc, unit="graph", disable=None):
        args = static_args(bucket)
        forward(*args)  # warm-up outside the graph: compiles kernels, settles allocations
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs[bucket] = forward(*args)
        if pool is None:
            pool = graph.pool()
        graphs[bucket] = graph
    torch.cuda.synchronize()
    return graphs, outputs, pool


def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (vLLM-like), largest last."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    return sorted(set(buckets + [max_num_seqs]))


class DecodeGraphs:
    def __init__(
        self, forward: ForwardFn, max_num_seqs: int, max_model_len: int, block_size: int, device: torch.device,
        order_rows: bool = True,
    ) -> None:
        self.forward = forward
        self.buckets = batch_size_buckets(max_num_seqs)
        self.max_model_len = max_model_len
        self.max_blocks = max_blocks = -(-max_model_len // block_size)
        self.max_num_seqs = n = max_num_seqs
        # Rows: token ids, positions, cache slots, fed-back token indices, fed-back source rows.
        self._int64 = torch.zeros(5, n, dtype=torch.int64, device=device)
        # Context lengths, row order, block tables.
        self._int32 = torch.zeros(2 * n + n * max_blocks, dtype=torch.int32, device=device)
        self.input_ids, self.positions, self.slot_mapping = self._int64[0], self._int64[1], self._int64[2]
        self.context_lens = self._int32[:n]
        self.row_order = self._int32[n : 2 * n]
        self.block_tables = self._int32[2 * n :].view(n, max_blocks)
        self.order_rows = order_rows  # False launches rows as batched (KernelConfig.order_decode_rows)
        self.slot_mapping.fill_(-1)
        self.context_lens.fill_(1)
        self.row_order.copy_(torch.arange(n, dtype=torch.int32, device=device))
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        # Two pinned mirrors used in turn: one is filled while the copy out of the other may still be queued.
        self._mirrors = [_HostMirror(self._int64, self._int32) for _ in range(2)]
        self._turn = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool: MemoryPool | None = None

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
            row_order=self.row_order[:bucket],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        self.graphs, self.outputs, self.pool = capture_graphs(self.forward, self.buckets, self._static_args, self.pool,
                                                              "CUDA graphs, decode steps")
        logger.info("captured CUDA graphs for decode batch sizes %s", self.buckets)

    def _static_args(self, bucket: int) -> StaticArgs:
        return self.input_ids[:bucket], self.positions[:bucket], self.metadata(bucket)

    def run(self, batch: Batch, last_sampled_ids: torch.Tensor | None) -> torch.Tensor:
        """Fills the static buffers from a decode-only batch (fed-back tokens read from `last_sampled_ids`
        on the device), replays the bucket's graph (or runs eagerly on the buffers when none was
        captured); returns [num_rows, hidden_size]."""
        num_rows = batch.num_rows
        bucket = self.bucket_for(num_rows)
        assert bucket is not None and batch.is_decode_only
        mirror = self._mirrors[self._turn]
        self._turn ^= 1
        num_int32 = mirror.fill(batch, bucket, self.max_num_seqs, self.max_blocks, self.order_rows)
        self._int64.copy_(mirror.int64, non_blocking=True)
        self._int32[:num_int32].copy_(mirror.int32[:num_int32], non_blocking=True)
        mirror.copied.record()
        if num_fed_back := len(batch.fed_back_token_indices):
            feed_back_tokens(self.input_ids, self._int64[3, :num_fed_back], self._int64[4, :num_fed_back],
                             last_sampled_ids)
        if bucket not in self.graphs:
            return self.forward(*self._static_args(bucket))[:num_rows]
        self.graphs[bucket].replay()
        return self.outputs[bucket][:num_rows]


class PinnedMirror:
    """Pinned host copies of a graph set's two static input buffers (int64, int32), and an event for when
    their copy to the device has run (decode graphs here, mixed_graphs.py's)."""

    def __init__(self, int64: torch.Tensor, int32: torch.Tensor) -> None:
        self.int64 = torch.zeros(int64.shape, dtype=int64.dtype).pin_memory()
        self.int32 = torch.zeros(int32.shape, dtype=int32.dtype).pin_memory()
        self.copied = torch.cuda.Event()
        self.copied.record()


class _HostMirror(PinnedMirror):
    def fill(self, batch: Batch, bucket: int, max_num_seqs: int, max_blocks: int, order_rows: bool) -> int:
        """Writes the batch (padded to the bucket) into the mirror; returns how many int32 entries to copy."""
        self.copied.synchronize()  # its previous copy has run (long since, in practice)
        rows = batch.num_rows
        int64, int32 = self.int64.numpy(), self.int32.numpy()
        int64[0, :rows] = batch.token_ids  # fed-back entries are placeholders, overwritten on the device
        int64[1, :rows] = batch.positions
        int64[2, :rows] = batch.slot_mapping
        int64[2, rows:bucket] = -1  # padded rows write nothing
        num_fed_back = len(batch.fed_back_token_indices)
        int64[3, :num_fed_back] = batch.fed_back_token_indices
        int64[4, :num_fed_back] = batch.fed_back_rows
        n = max_num_seqs
        int32[:rows] = batch.context_lens
        int32[rows:bucket] = 1  # padded rows attend to one token
        if order_rows:  # longest context first; padded rows (1 token) last
            int32[n : n + bucket] = np.argsort(-int32[:bucket], kind="stable")
        else:
            int32[n : n + bucket] = np.arange(bucket)
        # Entries past a row's blocks keep older (valid) block ids.
        write_block_tables(int32[2 * n : 2 * n + bucket * max_blocks].reshape(bucket, max_blocks), batch.block_tables)
        return 2 * n + bucket * max_blocks
