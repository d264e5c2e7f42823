"""CUDA graphs for verifying steps laid out on the device (gpu/device_verification.py): one graph per rows bucket and
draft length k, each holding the whole step (`verify_step`: drafts, layout, forward, logits, the draw at every
position, acceptance and the history's update), so that such a step costs the host a few inputs filled, one replay
and the copies of its results, where run eagerly it launches dozens of small kernels beside the forward.

Keys: rows buckets of powers of two (and max_num_seqs) for every k from 0 (a plain step laid out on the device) to
the configured most, where a step of
rows x (k + 1) positions fits `max_positions` (the shared logits buffer's rows, allocated before the KV cache is
sized, and at most a step's token budget, which the start-up's memory profile covers). Padding rows read the history's
padding slot (one token, gpu/token_history.py) and have no blocks: they write no K/V, keep no token and attend to
k + 1 tokens of a block their table names (an id some step wrote there, or 0).
The draw is the fused sampling kernel's, from static per-position Philox keys and temperatures (Sampler.graph_draw:
greedy and unseeded random rows without top-k, top-p or min-p); which steps a graph takes is the runner's rule.
Attention's max_context_len is max_model_len, as in the other graphs, so a replay's launch grids never change.

Static inputs: views of one int64 tensor (the rows' history slots and block counts, then the positions' Philox keys)
and one int32 tensor (the positions' temperatures as float32 bits, then the block tables), filled from one of two
pinned host mirrors with one copy each. Without a captured graph (tests on a CPU) a step runs the same function
eagerly on these buffers.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gpu import device_verification
from gpu.cuda_graphs import ForwardFn, MemoryPool, MirrorPair, PinnedMirror, capture_graphs
from gpu.device_verification import DeviceVerifyBatch, StepFunctions, StepInputs, StepShape, VerifiedOutputs
from gpu.host_to_device import write_block_tables
from gpu.sampler import GraphDraw
from gpu.token_history import TokenHistory

# The most positions (rows x (k + 1)) a captured step holds: their logits are one buffer held for good, and past a few
# hundred positions the launches a graph saves are a small share of the step.
MAX_POSITIONS = 512
Key = tuple[int, int]  # (rows bucket, k)
LogitsIntoFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (hidden, out [positions, vocab]) -> out
DrawFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, keys, temperatures) -> ids


def max_positions(max_num_seqs: int, max_drafts: int, max_num_batched_tokens: int) -> int:
    """The positions the verify graphs' largest step holds (see the module's doc)."""
    return min(max_num_seqs * (max_drafts + 1), MAX_POSITIONS, max_num_batched_tokens)


@dataclass(frozen=True)
class Lookup:
    """The n-gram lookup the graphs were captured for: speculative_config's most drafts and n-gram lengths."""

    max_drafts: int
    min_n: int
    max_n: int


class VerifyGraphs:
    def __init__(self, history: TokenHistory, forward: ForwardFn, logits_into: LogitsIntoFn, logits: torch.Tensor,
                 draw: DrawFn, lookup: Lookup, max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        """`logits`: [positions, vocab], shared with the decode graphs; its rows bound the steps held. `draw`: the
        fused sampling kernel (a stand-in on a CPU)."""
        self.history, self.forward, self.logits_into, self.logits = history, forward, logits_into, logits
        self.draw = draw
        self.lookup, self.max_model_len, self.block_size = lookup, max_model_len, block_size
        self.max_positions = num_positions = logits.shape[0]
        self.max_rows = n = max_num_seqs
        self.max_blocks = -(-max_model_len // block_size)
        buckets = sorted({1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs} | {max_num_seqs})
        # By positions, ascending: capture_graphs captures the largest first, so that later graphs fit in its memory.
        self.keys = sorted(((rows, k) for k in range(lookup.max_drafts + 1) for rows in buckets
                            if rows * (k + 1) <= num_positions), key=lambda key: (key[0] * (key[1] + 1), key))
        device = history.device
        self._int64 = torch.zeros(2 * n + num_positions, dtype=torch.int64, device=device)
        self._int32 = torch.zeros(num_positions + n * self.max_blocks, dtype=torch.int32, device=device)
        self._int64[:n].fill_(history.padding_slot)  # no row yet: what the captures read
        self._mirrors = MirrorPair(lambda: PinnedMirror(self._int64, self._int32))
        self.graphs: dict[Key, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[Key, VerifiedOutputs] = {}
        self.pool: MemoryPool | None = None

    def key_for(self, batch: DeviceVerifyBatch) -> Key | None:
        """The smallest graph that holds the batch (None: none does)."""
        if (batch.min_n, batch.max_n) != (self.lookup.min_n, self.lookup.max_n):
            return None
        held = [key for key in self.keys if key[1] == batch.num_drafts and key[0] >= batch.num_rows]
        return min(held, default=None)

    @torch.inference_mode()
    def capture(self) -> None:
        self.graphs, self.outputs, self.pool = capture_graphs(self._step, self.keys, lambda key: (key,), self.pool,
                                                              "CUDA graphs, verifying steps")

    def run(self, batch: DeviceVerifyBatch, draw: GraphDraw) -> VerifiedOutputs:
        """Fills the static inputs from the batch (its rows' Philox keys and temperatures from `draw`, one per
        position), replays the key's graph (or runs the step eagerly on the buffers where none was captured); the
        outputs of the batch's rows."""
        key = self.key_for(batch)
        assert key is not None and not draw.filtered
        mirror = self._mirrors.next()
        num_int32 = self._fill(mirror, batch, draw, key)
        self._int64.copy_(mirror.int64, non_blocking=True)
        self._int32[:num_int32].copy_(mirror.int32[:num_int32], non_blocking=True)
        mirror.copied.record()
        if key not in self.graphs:
            return self._step(key).rows(batch.num_rows)
        self.graphs[key].replay()
        return self.outputs[key].rows(batch.num_rows)

    def _step(self, key: Key) -> VerifiedOutputs:
        """What a graph holds: `verify_step` on the key's views of the static buffers."""
        rows, k = key
        n, num_positions = self.max_rows, rows * (k + 1)
        inputs = StepInputs(self._int64[:rows], self._int64[n : n + rows],
                            self._int32[self.max_positions :][: rows * self.max_blocks].view(rows, self.max_blocks))
        keys = self._int64[2 * n :][:num_positions]
        temperatures = self._int32[:num_positions].view(torch.float32)
        logits = self.logits[:num_positions]
        functions = StepFunctions(self.forward, lambda hidden: self.logits_into(hidden, logits),
                                  lambda step_logits: self.draw(step_logits, keys, temperatures))
        shape = StepShape(k, self.lookup.min_n, self.lookup.max_n, self.block_size, self.max_model_len)
        return device_verification.verify_step(self.history, inputs, shape, functions)  # the eager path's too

    def _fill(self, mirror: PinnedMirror, batch: DeviceVerifyBatch, draw: GraphDraw, key: Key) -> int:
        """Writes the batch, padded to the key's rows, into the mirror; returns how many int32 entries to copy."""
        rows, k = key
        n, num_rows = self.max_rows, batch.num_rows
        num_positions, num_used = rows * (k + 1), num_rows * (k + 1)
        int64, int32 = mirror.int64.numpy(), mirror.int32.numpy()
        int64[:num_rows], int64[num_rows:rows] = batch.slots, self.history.padding_slot
        int64[n : n + num_rows] = [len(table) for table in batch.block_tables]
        int64[n + num_rows : n + rows] = 0  # padding rows: no blocks
        keys = int64[2 * n :]
        keys[:num_used], keys[num_used:num_positions] = draw.keys, 0
        temperatures = int32[: self.max_positions].view(np.float32)
        temperatures[:num_used], temperatures[num_used:num_positions] = draw.temperatures, 0.0  # padding: greedy
        # Entries past a row's blocks, and padding rows', keep older (valid) block ids.
        tables = int32[self.max_positions :][: rows * self.max_blocks].reshape(rows, self.max_blocks)
        write_block_tables(tables, batch.block_tables)
        return self.max_positions + rows * self.max_blocks
