"""CUDA graphs for the steps that carry prefill: one graph per padded token bucket and row capacity.

Such a step (prefill chunks, prefix-cache hits, decode rows beside them) is padded to the smallest
token bucket that holds it, and its rows to the smallest of the bucket's row capacities that holds
them: min(max_num_seqs, bucket) (a step never has more rows than tokens), and FEW_ROWS for steps of
prompts alone (a burst of requests, a decode hold). Padding tokens write no K/V (slot -1) and sit at position 0; padding
rows have no queries (query_start_loc repeats the token count) and context 0, so the attention
kernel's programs for them exit at once and every launch grid depends only on the bucket and the
capacity. Their outputs are ignored. Only a backend whose non-decode path is safe to capture this
way (`supports_mixed_graphs`: Triton, FA4 on Hopper) gets these graphs.

Why a second capacity: the padding rows' programs still launch, and a few prompts padded to hundreds of
rows cost FA4's prefill kernel a good share of its time.

Why graphs: run eagerly, such a step is launched op by op from Python, and for a small model the host's
launches take longer than the device's work; a replay is one launch.
With graphs off (`--enforce-eager`) the same padded buffers run eagerly, so graphs on and off
compute the same numbers, as for decode (gpu/cuda_graphs.py, whose memory pool these graphs share).

The static inputs are views of one int64 and one int32 tensor (StaticInputs), filled from one of
two pinned host mirrors used in turn, with one contiguous copy each; a model with several KV-cache groups has
slots and block tables per group in them.

A model with linear-attention layers (gpu/layers/gated_deltanet.py) also reads its rows' state inputs from them
(`LinearRows`, gpu/state_cache.py's `padded_rows`): every row, one-token rows too, through the sequential prompt
kernels, padding rows with the padding state row of the decode graphs and one empty piece. Only a step whose rows
each fit the sequential delta rule and that verifies no drafts runs so (`bucket_for`): longer rows go through
flash-linear-attention's chunked kernel, whose chunk indices are built on the host, and draft rows position by
position; such steps run eagerly, unpadded. Snapshot copies at a row's start or end are the runner's, outside the
forward.
"""

import logging
from dataclasses import dataclass

import numpy as np
import torch

from gpu.attention.metadata import AttentionMetadata, LinearStateMetadata
from gpu.batch import Batch
from gpu.cuda_graphs import ForwardFn, MemoryPool, MirrorPair, PinnedMirror, StaticArgs, capture_graphs
from gpu.host_to_device import WrittenTables, write_block_tables
from gpu.pending_step import feed_back_tokens
from gpu.state_cache import fill_padded_rows, padded_rows, padded_rows_size

logger = logging.getLogger(__name__)

FEW_ROWS = 32  # the small row capacity of every bucket larger than it


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """16 to 512 by doubling, then every 256 up to 2048, then every 512, and the budget itself (largest last).

    Padding costs compute for at most an eighth of the tokens past 2048, where steps are compute-bound."""
    candidates = [16, 32, 64, 128, 256, 512, *range(768, 2049, 256), *range(2560, max_num_batched_tokens, 512)]
    return sorted({b for b in candidates if b < max_num_batched_tokens} | {max_num_batched_tokens})


@dataclass(frozen=True)
class LinearRows:
    """What the padded state inputs of a model with linear-attention layers need."""

    num_state_slots: int  # the sequence slots (warm-up steps without slots take row % this)
    padding_slot: int  # the state row padding rows read and write (the decode graphs' padded rows' too)
    max_row_tokens: int  # the sequential delta rule's limit: a step's rows each at most this long

    def bucket_tokens(self, bucket: int) -> int:
        """The most tokens a row of the bucket can have: the conv kernel's token blocks."""
        return min(bucket, self.max_row_tokens)


class StaticInputs:
    """The device buffers a mixed-step graph reads, and how a batch is written into them.

    Each bucket lays its fields out from the start of the two flat tensors (int64: token ids,
    positions, slots, fed-back token indices, their source rows, then the slots of KV-cache groups 1, 2, ...,
    `bucket` entries each; int32: query_start_loc, context lengths, block tables of group 0, 1, ..., for the
    bucket's row capacity), so a step copies one contiguous prefix of each; a graph reads the views of its own bucket.
    With `linear`, the int64 fields go on with the rows' state inputs (gpu/state_cache.py's `padded_rows`) and the
    int32 ones with the rows' keeps (float32 bits).
    """

    def __init__(self, max_tokens: int, max_rows: int, max_blocks: int, device: torch.device,
                 num_groups: int = 1, linear: LinearRows | None = None) -> None:
        self.max_rows, self.max_blocks, self.num_groups, self.linear = max_rows, max_blocks, num_groups, linear
        state_int64, state_int32 = (padded_rows_size(max_tokens, max_rows), max_rows) if linear else (0, 0)
        self.int64 = torch.zeros((4 + num_groups) * max_tokens + state_int64, dtype=torch.int64, device=device)
        self.int32 = torch.zeros(int32_size(max_rows, max_blocks, num_groups) + state_int32, dtype=torch.int32,
                                 device=device)

    def row_capacities(self, bucket: int) -> list[int]:
        """The bucket's row capacities, ascending: FEW_ROWS and the most rows a step of `bucket` tokens can have."""
        full = min(self.max_rows, bucket)
        return sorted({min(FEW_ROWS, full), full})

    def fields(self, bucket: int) -> torch.Tensor:
        """[4 + num_groups, bucket]: token ids, positions, slots, fed-back token indices, fed-back source rows,
        the slots of groups 1, 2, ..."""
        return self.int64[: (4 + self.num_groups) * bucket].view(4 + self.num_groups, bucket)

    def metadata(self, bucket: int, rows: int, max_model_len: int) -> AttentionMetadata:
        """The attention inputs of `bucket` tokens and a capacity of `rows` rows."""
        fields = self.fields(bucket)
        tables = self.int32[2 * rows + 1 : int32_size(rows, self.max_blocks, self.num_groups)]
        tables = tables.view(self.num_groups, rows, self.max_blocks)
        meta = AttentionMetadata(
            slot_mapping=fields[2],
            query_start_loc=self.int32[: rows + 1],
            context_lens=self.int32[rows + 1 : 2 * rows + 1],
            block_tables=tables[0],
            max_query_len=bucket,
            max_context_len=max_model_len,
            is_decode_only=False,
            linear_state=None if self.linear is None else self._linear_state(bucket, rows),
        )
        return meta if self.num_groups == 1 else meta.with_group_tables(list(fields[5:]), list(tables[1:]))

    def _linear_state(self, bucket: int, rows: int) -> LinearStateMetadata:
        assert self.linear is not None
        start = (4 + self.num_groups) * bucket
        keeps_start = int32_size(rows, self.max_blocks, self.num_groups)
        keeps = self.int32[keeps_start : keeps_start + rows].view(torch.float32)
        return padded_rows(self.int64[start:], keeps, bucket, rows, self.linear.bucket_tokens(bucket))


def int32_size(rows: int, max_blocks: int, num_groups: int = 1) -> int:
    return 2 * rows + 1 + num_groups * rows * max_blocks


def fill_host_inputs(int64: np.ndarray, int32: np.ndarray, batch: Batch, bucket: int, rows_cap: int,
                     max_blocks: int, linear: LinearRows | None = None, written: WrittenTables | None = None
                     ) -> tuple[int, int]:
    """Writes the batch, padded to the bucket, into flat host arrays laid out as StaticInputs' bucket views (with
    `linear`, the rows' state inputs too); returns how many leading int64 and int32 entries to copy. `written`: what
    the arrays' block-table region holds from earlier fills (None: every row is written)."""
    n, rows = len(batch.token_ids), batch.num_rows
    num_groups = 1 + len(batch.other_groups)
    fields = int64[: (4 + num_groups) * bucket].reshape(4 + num_groups, bucket)
    fields[0, :n], fields[0, n:] = batch.token_ids, 0  # fed-back entries: placeholders, set on the device
    fields[1, :n], fields[1, n:] = batch.positions, 0
    fields[2, :n], fields[2, n:] = batch.slot_mapping, -1
    for index, group in enumerate(batch.other_groups, start=5):
        fields[index, :n], fields[index, n:] = group.slot_mapping, -1
    num_fed_back = len(batch.fed_back_token_indices)
    fields[3, :num_fed_back] = batch.fed_back_token_indices
    fields[4, :num_fed_back] = batch.fed_back_rows
    query_start_loc = int32[: rows_cap + 1]
    query_start_loc[0] = 0
    query_start_loc[1 : rows + 1] = np.cumsum(batch.query_lens)
    query_start_loc[rows + 1 :] = n  # padding rows: no queries
    context_lens = int32[rows_cap + 1 : 2 * rows_cap + 1]
    context_lens[:rows], context_lens[rows:] = batch.context_lens, 0
    num_int32 = int32_size(rows_cap, max_blocks, num_groups)
    tables = int32[2 * rows_cap + 1 : num_int32].reshape(num_groups, rows_cap, max_blocks)
    group_tables = [batch.block_tables, *(g.block_tables for g in batch.other_groups)]
    if written is None:
        for group, rows_tables in enumerate(group_tables):
            write_block_tables(tables[group, :rows], rows_tables)  # padding rows' entries are never read
    else:
        written.write(tables, group_tables, batch.table_epochs, (rows_cap, max_blocks, num_groups))
    if linear is None:
        return (4 + num_groups) * bucket, num_int32
    num_state = fill_linear_rows(int64, int32, batch, bucket, rows_cap, max_blocks, num_groups, linear)
    return (4 + num_groups) * bucket + num_state, num_int32 + rows_cap


def fill_linear_rows(int64: np.ndarray, int32: np.ndarray, batch: Batch | None, bucket: int, rows_cap: int,
                     max_blocks: int, num_groups: int, linear: LinearRows) -> int:
    """The rows' state inputs after the bucket's fields (None: no row, as graphs are captured); returns how many
    int64 entries they take."""
    keeps_start = int32_size(rows_cap, max_blocks, num_groups)
    keeps = int32[keeps_start : keeps_start + rows_cap].view(np.float32)
    return fill_padded_rows(int64[(4 + num_groups) * bucket :], keeps, batch, bucket, rows_cap,
                            linear.num_state_slots, linear.padding_slot)


class MixedGraphs:
    def __init__(self, forward: ForwardFn, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device, num_groups: int = 1, linear: LinearRows | None = None
                 ) -> None:
        """`linear`: a model with linear-attention layers' state inputs (see the module docstring)."""
        self.forward = forward
        self.buckets = token_buckets(max_num_batched_tokens)
        self.max_model_len = max_model_len
        self.inputs = StaticInputs(self.buckets[-1], max_num_seqs, -(-max_model_len // block_size), device,
                                   num_groups, linear)
        self._mirrors = MirrorPair(lambda: PinnedMirror(self.inputs.int64, self.inputs.int32))
        # (token bucket, row capacity), ascending: every graph captured
        self.keys = [(bucket, rows) for bucket in self.buckets for rows in self.inputs.row_capacities(bucket)]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.pool: MemoryPool | None = None

    def bucket_for(self, batch: Batch) -> tuple[int, int] | None:
        """(token bucket, row capacity) of the smallest graph that holds the batch, None if none does (or, for a
        model with linear-attention layers, if a row is past the sequential delta rule or verifies drafts)."""
        linear = self.inputs.linear
        if linear is not None and (batch.num_draft_tokens is not None or max(batch.query_lens) > linear.max_row_tokens):
            return None
        num_tokens = len(batch.token_ids)
        bucket = next((b for b in self.buckets if b >= num_tokens), None)
        if bucket is None:
            return None
        rows = next((r for r in self.inputs.row_capacities(bucket) if r >= batch.num_rows), None)
        return None if rows is None else (bucket, rows)

    def _static_args(self, key: tuple[int, int]) -> StaticArgs:
        bucket, rows = key
        fields = self.inputs.fields(bucket)
        return fields[0], fields[1], self.inputs.metadata(bucket, rows, self.max_model_len)

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every bucket and row capacity, largest first (later graphs fit in its pool), with empty rows
        (query_start_loc and context lengths all 0): the kernels launch, no program does work."""
        self.graphs, self.outputs, self.pool = capture_graphs(self.forward, self.keys, self._empty_args, self.pool,
                                                              "CUDA graphs, steps with prefill")
        logger.info("captured CUDA graphs for steps with prefill, token buckets %s (row capacities %d and the "
                    "bucket's most)", self.buckets, FEW_ROWS)

    def _empty_args(self, key: tuple[int, int]) -> StaticArgs:
        """The graph's static args, holding no row and writing no K/V."""
        self.inputs.int32.zero_()
        fields = self.inputs.fields(key[0])
        fields[2].fill_(-1)  # slots: no K/V written
        fields[5:].fill_(-1)
        if (linear := self.inputs.linear) is not None:  # padding rows only
            int64 = self.inputs.int64.new_zeros(self.inputs.int64.shape, device="cpu")
            int32 = self.inputs.int32.new_zeros(self.inputs.int32.shape, device="cpu")
            size = fill_linear_rows(int64.numpy(), int32.numpy(), None, *key, self.inputs.max_blocks,
                                    self.inputs.num_groups, linear)
            start = (4 + self.inputs.num_groups) * key[0]
            self.inputs.int64[start : start + size].copy_(int64[start : start + size])
        return self._static_args(key)

    def run(self, batch: Batch, last_sampled_ids: torch.Tensor | None,
            laid_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Fills the static buffers (fed-back tokens read from `last_sampled_ids` on the device), replays the
        bucket's graph (or runs eagerly on the buffers when none was captured); returns [num_tokens, hidden].
        `laid_out`: the step's token ids, positions, slots and context lengths computed on the device (a verifying
        step laid out there: gpu/device_verification.py), written over the batch's placeholders."""
        key = self.bucket_for(batch)
        assert key is not None
        bucket, rows = key
        mirror = self._mirrors.next()
        num_int64, num_int32 = fill_host_inputs(mirror.int64.numpy(), mirror.int32.numpy(), batch, bucket, rows,
                                                self.inputs.max_blocks, self.inputs.linear, mirror.written_tables)
        self.inputs.int64[:num_int64].copy_(mirror.int64[:num_int64], non_blocking=True)
        self.inputs.int32[:num_int32].copy_(mirror.int32[:num_int32], non_blocking=True)
        mirror.copied.record()
        if num_fed_back := len(batch.fed_back_token_indices):
            fields = self.inputs.fields(bucket)
            feed_back_tokens(fields[0], fields[3, :num_fed_back], fields[4, :num_fed_back], last_sampled_ids)
        num_tokens = len(batch.token_ids)
        if laid_out is not None:
            fields = self.inputs.fields(bucket)
            for field, values in zip(fields[:3], laid_out[:3], strict=True):
                field[:num_tokens].copy_(values)
            self.inputs.int32[rows + 1 : rows + 1 + batch.num_rows].copy_(laid_out[3])  # the context lengths
        if key not in self.graphs:
            return self.forward(*self._static_args(key))[:num_tokens]
        self.graphs[key].replay()
        return self.outputs[key][:num_tokens]
