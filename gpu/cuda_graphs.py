"""CUDA graphs for decode-only steps: one graph per padded batch-size bucket, sharing one memory pool.

Each graph reads static input buffers that are filled in place before replay (no allocation per
step) and writes a static hidden-state buffer. With a sampling head (a single-GPU runner on CUDA with the
fused sampling kernel) a graph also computes the logits of every row and samples them with the fused
kernel (gpu/kernels/sampling.py) from static per-row Philox keys and temperatures, so a plain decode step
(no penalties, bias, bans or token masks) is one replay from its inputs to its token ids: no launches
from the host between the forward pass and the tokens. A step that needs the eager sampler still replays
the same graph and samples the graph's logits (the in-graph draw is then unused).
With graphs off (`--enforce-eager`) decode steps still run on these padded static buffers, eagerly:
the kernels then see exactly the shapes they see under a graph, so graphs on and off compute the same
numbers. Padded rows write no K/V (slot -1) and attend to one
token of a valid block, so they cost little and never fault; their outputs are ignored. The
attention metadata a graph was captured with is static too: `max_context_len` is `max_model_len`,
so a kernel that sizes its launch from it launches the same grid at every replay.
A model with linear-attention layers (gpu/state_cache.py) also reads each row's state slot and whether it continues
its state from two more static buffers; padded rows name the state cache's padding row and start from zeros.

The static buffers are views of two device tensors (int64: token ids, positions, slots, the
fed-back token indices and the rows' Philox keys, then the slots of each further KV-cache group; int32: context
lengths, the rows' launch order, the temperatures' float32 bits and block tables, one table per KV-cache group),
filled from pinned host mirrors with two copies a step (and one more per further group, for its tables), instead of
a copy and a device-side scatter per input.
The launch order (rows by descending context, sorted on the host) lets the decode attention kernel
start the longest rows first, so the step does not end on a few long rows started last.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import torch
from tqdm import tqdm

from gpu.attention.metadata import AttentionMetadata, LinearStateMetadata
from gpu.batch import Batch
from gpu.host_to_device import WrittenTables, to_device
from gpu.pending_step import feed_back_tokens

if TYPE_CHECKING:
    from gpu.sampler import GraphDraw

logger = logging.getLogger(__name__)

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
StaticArgs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata]  # a forward's arguments, static buffers' views
MemoryPool = tuple[int, int]  # CUDAGraph.pool()'s handle
LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (hidden [rows, hidden], out [rows, vocab]) -> out
Output = TypeVar("Output")
Mirror = TypeVar("Mirror", bound="PinnedMirror")
Key = TypeVar("Key", int, tuple[int, int])  # a graph's bucket: rows (decode), (tokens, row capacity) (prefill)


@dataclass(frozen=True)
class DecodeOutputs:
    """A decode step's results on the device, the bucket's static buffers cut to the batch's rows."""

    hidden: torch.Tensor  # [rows, hidden_size]
    logits: torch.Tensor | None = None  # [rows, vocab]: with a sampling head
    token_ids: torch.Tensor | None = None  # [rows] int64, the fused kernel's draw from the static keys

    def rows(self, num_rows: int) -> "DecodeOutputs":
        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:num_rows]
        return DecodeOutputs(self.hidden[:num_rows], cut(self.logits), cut(self.token_ids))


def capture_graphs(forward: Callable[..., Output], buckets: list[Key], static_args: Callable[[Key], tuple[object, ...]],
                   pool: MemoryPool | None, desc: str,
                   ) -> tuple[dict[Key, torch.cuda.CUDAGraph], dict[Key, Output], MemoryPool | None]:
    """One graph of `forward` per bucket (`buckets` ascending) on the bucket's static args, largest first so that
    later graphs fit in its memory, all in one pool (`pool`, or a new one); returns the graphs, their static outputs
    and the pool. Used for decode steps here, for steps with prefill (mixed_graphs.py) and for verifying steps
    laid out on the device (verify_graphs.py)."""
    graphs: dict[Key, torch.cuda.CUDAGraph] = {}
    outputs: dict[Key, Output] = {}
    eager_s = capture_s = 0.0  # the host's seconds in each part, for the log: where start-up time goes
    for bucket in tqdm(list(reversed(buckets)), desc=desc, unit="graph", disable=None):
        args = static_args(bucket)
        start = time.perf_counter()
        forward(*args)  # warm-up outside the graph: compiles kernels, settles allocations
        middle = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs[bucket] = forward(*args)
        if pool is None:
            pool = graph.pool()
        graphs[bucket] = graph
        eager_s, capture_s = eager_s + middle - start, capture_s + time.perf_counter() - middle
    torch.cuda.synchronize()
    logger.info("%s: %d graphs, eager runs %.1f s, captures %.1f s", desc, len(graphs), eager_s, capture_s)
    return graphs, outputs, pool


def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (vLLM-like), largest last."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    return sorted(set(buckets + [max_num_seqs]))


class DecodeGraphs:
    def __init__(
        self, forward: ForwardFn, max_num_seqs: int, max_model_len: int, block_size: int, device: torch.device,
        logits_fn: LogitsFn | None = None, logits: torch.Tensor | None = None, num_groups: int = 1,
        padding_state_slot: int | None = None,
    ) -> None:
        """`padding_state_slot`: a model with linear-attention layers' state row for padded rows."""
        self.forward = forward
        # The sampling head: each graph writes its rows' logits into `logits` ([max_num_seqs, vocab], one buffer
        # for every graph, allocated by the caller before the KV cache is sized) and draws from them.
        self.logits_fn = logits_fn
        self.logits = logits
        assert (logits_fn is None) == (logits is None), "a sampling head needs its logits buffer"
        self.buckets = batch_size_buckets(max_num_seqs)
        self.max_model_len = max_model_len
        self.max_blocks = max_blocks = -(-max_model_len // block_size)
        self.max_num_seqs = n = max_num_seqs
        self.num_groups = num_groups
        # Rows: token ids, positions, cache slots, fed-back token indices, fed-back source rows, Philox keys, then
        # the cache slots of KV-cache groups 1, 2, ...
        self._int64 = torch.zeros(5 + num_groups, n, dtype=torch.int64, device=device)
        # Context lengths, row order, temperatures (float32 bits), block tables of group 0, 1, ...
        self._int32 = torch.zeros(3 * n + num_groups * n * max_blocks, dtype=torch.int32, device=device)
        self.input_ids, self.positions, self.slot_mapping = self._int64[0], self._int64[1], self._int64[2]
        self.philox_keys = self._int64[5]
        self.group_slot_mappings = [self.slot_mapping, *self._int64[6:]]
        self.context_lens = self._int32[:n]
        self.row_order = self._int32[n : 2 * n]
        self.temperatures = self._int32[2 * n : 3 * n].view(torch.float32)  # 0 on greedy (and padding) rows
        self.group_block_tables = list(self._int32[3 * n :].view(num_groups, n, max_blocks))
        self.block_tables = self.group_block_tables[0]
        for slots in self.group_slot_mappings:
            slots.fill_(-1)
        self.context_lens.fill_(1)
        self.row_order.copy_(torch.arange(n, dtype=torch.int32, device=device))
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.padding_state_slot = padding_state_slot
        self.state_slots = torch.full((n,), padding_state_slot or 0, dtype=torch.int64, device=device)
        self.keeps_state = torch.zeros(n, dtype=torch.float32, device=device)
        self._mirrors = MirrorPair(lambda: _HostMirror(self._int64, self._int32))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, DecodeOutputs] = {}
        self.pool: MemoryPool | None = None

    def bucket_for(self, num_rows: int) -> int | None:
        return next((b for b in self.buckets if b >= num_rows), None)

    def metadata(self, bucket: int) -> AttentionMetadata:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            query_start_loc=self.query_start_loc[: bucket + 1],
            context_lens=self.context_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            max_query_len=1,
            max_context_len=self.max_model_len,
            is_decode_only=True,
            row_order=self.row_order[:bucket],
            linear_state=None if self.padding_state_slot is None else LinearStateMetadata(
                self.state_slots[:bucket], self.keeps_state[:bucket], continues=(), row_pieces=(),
                is_one_token_per_row=True),
        )
        if self.num_groups == 1:
            return meta
        return meta.with_group_tables([slots[:bucket] for slots in self.group_slot_mappings[1:]],
                                      [tables[:bucket] for tables in self.group_block_tables[1:]])

    @property
    def samples(self) -> bool:
        """Whether each step also computes the logits and samples them (a sampling head)."""
        return self.logits_fn is not None

    @torch.inference_mode()
    def capture(self) -> None:
        self.graphs, self.outputs, self.pool = capture_graphs(self._step, self.buckets, self._static_args, self.pool,
                                                              "CUDA graphs, decode steps")
        logger.info("captured CUDA graphs for decode batch sizes %s%s", self.buckets,
                    ", sampling inside" if self.samples else "")

    def _static_args(self, bucket: int) -> StaticArgs:
        return self.input_ids[:bucket], self.positions[:bucket], self.metadata(bucket)

    def _step(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> DecodeOutputs:
        """What a graph holds: the forward pass, and with a sampling head the logits and the draw."""
        hidden = self.forward(input_ids, positions, meta)
        if self.logits_fn is None:
            return DecodeOutputs(hidden)
        from gpu.kernels.sampling import sample_tokens

        assert self.logits is not None
        rows = hidden.shape[0]
        logits = self.logits_fn(hidden, self.logits[:rows])
        token_ids = sample_tokens(logits, self.philox_keys[:rows], self.temperatures[:rows], use_pdl=True)
        return DecodeOutputs(hidden, logits, token_ids)

    def run(self, batch: Batch, last_sampled_ids: torch.Tensor | None,
            draw: "GraphDraw | None" = None) -> DecodeOutputs:
        """Fills the static buffers from a decode-only batch (fed-back tokens read from `last_sampled_ids`
        on the device, and with a sampling head `draw`: each row's Philox key and temperature, or None when
        the step's draw is not used), replays the bucket's graph (or runs eagerly on the buffers when none
        was captured); returns the outputs of the batch's rows."""
        num_rows = batch.num_rows
        bucket = self.bucket_for(num_rows)
        assert bucket is not None and batch.is_decode_only
        mirror = self._mirrors.next()
        num_int32 = mirror.fill(batch, bucket, self.max_num_seqs, self.max_blocks, draw)
        self._int64.copy_(mirror.int64, non_blocking=True)
        self._int32[:num_int32].copy_(mirror.int32[:num_int32], non_blocking=True)
        for group in range(1, self.num_groups):  # each further group's tables: the bucket's rows of its region
            start = 3 * self.max_num_seqs + group * self.max_num_seqs * self.max_blocks
            self._int32[start : start + bucket * self.max_blocks].copy_(
                mirror.int32[start : start + bucket * self.max_blocks], non_blocking=True)
        mirror.copied.record()
        if self.padding_state_slot is not None:
            self._fill_state_inputs(batch, bucket)
        if num_fed_back := len(batch.fed_back_token_indices):
            feed_back_tokens(self.input_ids, self._int64[3, :num_fed_back], self._int64[4, :num_fed_back],
                             last_sampled_ids)
        if bucket not in self.graphs:
            return self._step(*self._static_args(bucket)).rows(num_rows)
        self.graphs[bucket].replay()
        return self.outputs[bucket].rows(num_rows)


    def _fill_state_inputs(self, batch: Batch, bucket: int) -> None:
        """Each row's state slot and whether it continues its state (a context before its token); padded rows the
        padding slot, from zeros."""
        padding = bucket - batch.num_rows
        row_slots = batch.state_slots or [self.padding_state_slot] * batch.num_rows  # the runner's warm-up steps
        slots = np.array([*row_slots, *[self.padding_state_slot] * padding], dtype=np.int64)
        keeps = np.array([c > 1 for c in batch.context_lens] + [False] * padding, dtype=np.float32)
        self.state_slots[:bucket].copy_(to_device(slots, np.int64, self.state_slots.device), non_blocking=True)
        self.keeps_state[:bucket].copy_(to_device(keeps, np.float32, self.keeps_state.device), non_blocking=True)


class PinnedMirror:
    """Pinned host copies of a graph set's two static input buffers (int64, int32), and an event for when
    their copy to the device has run (decode graphs here, mixed_graphs.py's). For buffers on a CPU (tests run the
    padded steps there, eagerly) plain memory and no event: the copy is done when it returns."""

    def __init__(self, int64: torch.Tensor, int32: torch.Tensor) -> None:
        on_cuda = int64.is_cuda
        self.int64 = torch.zeros(int64.shape, dtype=int64.dtype, pin_memory=on_cuda)
        self.int32 = torch.zeros(int32.shape, dtype=int32.dtype, pin_memory=on_cuda)
        self.copied: torch.cuda.Event | _CopiedAtOnce = torch.cuda.Event() if on_cuda else _CopiedAtOnce()
        self.copied.record()
        self.written_tables = WrittenTables()  # what its block-table region holds


class MirrorPair(Generic[Mirror]):
    """Two pinned mirrors of a graph set's static inputs, used in turn: one is filled while the copy out of the other
    may still be queued."""

    def __init__(self, make: Callable[[], Mirror]) -> None:
        self._mirrors = (make(), make())
        self._turn = 0

    def next(self) -> Mirror:
        """The mirror to fill now, once its previous copy has run (long since, in practice)."""
        mirror = self._mirrors[self._turn]
        self._turn ^= 1
        mirror.copied.synchronize()
        return mirror


class _CopiedAtOnce:
    """A CPU mirror's stand-in for the copy's event: a CPU copy has run when it returns."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _HostMirror(PinnedMirror):
    def fill(self, batch: Batch, bucket: int, max_num_seqs: int, max_blocks: int,
             draw: "GraphDraw | None" = None) -> int:
        """Writes the batch (padded to the bucket) into the mirror; returns how many int32 entries to copy."""
        rows = batch.num_rows
        int64, int32 = self.int64.numpy(), self.int32.numpy()
        int64[0, :rows] = batch.token_ids  # fed-back entries are placeholders, overwritten on the device
        int64[1, :rows] = batch.positions
        int64[2, :rows] = batch.slot_mapping
        int64[2, rows:bucket] = -1  # padded rows write nothing
        for index, group in enumerate(batch.other_groups, start=6):
            int64[index, :rows] = group.slot_mapping
            int64[index, rows:bucket] = -1
        num_fed_back = len(batch.fed_back_token_indices)
        int64[3, :num_fed_back] = batch.fed_back_token_indices
        int64[4, :num_fed_back] = batch.fed_back_rows
        n = max_num_seqs
        int32[:rows] = batch.context_lens
        int32[rows:bucket] = 1  # padded rows attend to one token
        int32[n : n + bucket] = np.argsort(-int32[:bucket], kind="stable")  # longest context first, padding last
        if draw is not None:  # padded rows: key 0, temperature 0 (greedy); their tokens are ignored
            keys, temperatures = draw.keys, draw.temperatures
            int64[5, :rows] = keys
            int64[5, rows:bucket] = 0
            int32[2 * n : 2 * n + rows] = temperatures.view(np.int32)
            int32[2 * n + rows : 2 * n + bucket] = 0  # the bits of 0.0
        # Entries past a row's blocks keep older (valid) block ids; rows whose tables did not change keep theirs.
        group_tables = [batch.block_tables, *(g.block_tables for g in batch.other_groups)]
        tables = int32[3 * n : 3 * n + len(group_tables) * n * max_blocks].reshape(len(group_tables), n, max_blocks)
        self.written_tables.write(tables, group_tables, batch.table_epochs, (n, max_blocks, len(group_tables)))
        return 3 * n + bucket * max_blocks
