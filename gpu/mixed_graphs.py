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
"""

import logging

import numpy as np
import torch

from gpu.attention.metadata import AttentionMetadata
from gpu.batch import Batch
from gpu.cuda_graphs import ForwardFn, MemoryPool, PinnedMirror, StaticArgs, capture_graphs
from gpu.host_to_device import write_block_tables
from gpu.pending_step import feed_back_tokens

logger = logging.getLogger(__name__)

FEW_ROWS = 32  # the small row capacity of every bucket larger than it


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """16 to 512 by doubling, then every 256 up to 2048, then every 512, and the budget itself (largest last).

    Padding costs compute for at most an eighth of the tokens past 2048, where steps are compute-bound."""
    candidates = [16, 32, 64, 128, 256, 512, *range(768, 2049, 256), *range(2560, max_num_batched_tokens, 512)]
    return sorted({b for b in candidates if b < max_num_batched_tokens} | {max_num_batched_tokens})


class StaticInputs:
    """The device buffers a mixed-step graph reads, and how a batch is written into them.

    Each bucket lays its fields out from the start of the two flat tensors (int64: token ids,
    positions, slots, fed-back token indices, their source rows, then the slots of KV-cache groups 1, 2, ...,
    `bucket` entries each; int32: query_start_loc, context lengths, block tables of group 0, 1, ..., for the
    bucket's row capacity), so a step copies one contiguous prefix of each; a graph reads the views of its own bucket.
    """

    def __init__(self, max_tokens: int, max_rows: int, max_blocks: int, device: torch.device,
                 num_groups: int = 1) -> None:
        self.max_rows, self.max_blocks, self.num_groups = max_rows, max_blocks, num_groups
        self.int64 = torch.zeros((4 + num_groups) * max_tokens, dtype=torch.int64, device=device)
        self.int32 = torch.zeros(int32_size(max_rows, max_blocks, num_groups), dtype=torch.int32, device=device)

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
        )
        return meta if self.num_groups == 1 else meta.with_group_tables(list(fields[5:]), list(tables[1:]))


def int32_size(rows: int, max_blocks: int, num_groups: int = 1) -> int:
    return 2 * rows + 1 + num_groups * rows * max_blocks


def fill_host_inputs(int64: np.ndarray, int32: np.ndarray, batch: Batch, bucket: int, rows_cap: int,
                     max_blocks: int) -> tuple[int, int]:
    """Writes the batch, padded to the bucket, into flat host arrays laid out as StaticInputs' bucket views;
    returns how many leading int64 and int32 entries to copy."""
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
    for group, group_tables in enumerate([batch.block_tables, *(g.block_tables for g in batch.other_groups)]):
        write_block_tables(tables[group, :rows], group_tables)  # padding rows' entries are never read
    return (4 + num_groups) * bucket, num_int32


class MixedGraphs:
    def __init__(self, forward: ForwardFn, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device, num_groups: int = 1) -> None:
        self.forward = forward
        self.buckets = token_buckets(max_num_batched_tokens)
        self.max_model_len = max_model_len
        self.inputs = StaticInputs(self.buckets[-1], max_num_seqs, -(-max_model_len // block_size), device,
                                   num_groups)
        self._mirrors = [PinnedMirror(self.inputs.int64, self.inputs.int32) for _ in range(2)]
        self._turn = 0
        # (token bucket, row capacity), ascending: every graph captured
        self.keys = [(bucket, rows) for bucket in self.buckets for rows in self.inputs.row_capacities(bucket)]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.pool: MemoryPool | None = None

    def bucket_for(self, batch: Batch) -> tuple[int, int] | None:
        """(token bucket, row capacity) of the smallest graph that holds the batch, None if none does."""
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
        return self._static_args(key)

    def run(self, batch: Batch, last_sampled_ids: torch.Tensor | None) -> torch.Tensor:
        """Fills the static buffers (fed-back tokens read from `last_sampled_ids` on the device), replays the
        bucket's graph (or runs eagerly on the buffers when none was captured); returns [num_tokens, hidden]."""
        key = self.bucket_for(batch)
        assert key is not None
        bucket, rows = key
        mirror = self._mirrors[self._turn]
        self._turn ^= 1
        mirror.copied.synchronize()  # its previous copy has run (long since, in practice)
        num_int64, num_int32 = fill_host_inputs(mirror.int64.numpy(), mirror.int32.numpy(), batch, bucket, rows,
                                                self.inputs.max_blocks)
        self.inputs.int64[:num_int64].copy_(mirror.int64[:num_int64], non_blocking=True)
        self.inputs.int32[:num_int32].copy_(mirror.int32[:num_int32], non_blocking=True)
        mirror.copied.record()
        if num_fed_back := len(batch.fed_back_token_indices):
            fields = self.inputs.fields(bucket)
            feed_back_tokens(fields[0], fields[3, :num_fed_back], fields[4, :num_fed_back], last_sampled_ids)
        num_tokens = len(batch.token_ids)
        if key not in self.graphs:
            return self.forward(*self._static_args(key))[:num_tokens]
        self.graphs[key].replay()
        return self.outputs[key][:num_tokens]
