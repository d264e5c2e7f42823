"""A verifying step laid out on the device (speculative decoding by prompt lookup): its inputs come from the token
history (gpu/token_history.py), not from the host, so it can be queued before the previous step's tokens reach the
host, as a plain decode step is.

Every row has the same shape, k + 1 query tokens: the last token of its history (the previous step's bonus token, whose
K/V is not computed yet) and k drafts found in the history (prompt lookup's search as gpu/kernels/ngram_drafts.py
states it; a row without a match verifies k placeholder tokens, of which none is accepted). With k = 0 it is a plain
decode step laid out so: the way out of verification that need not wait for the verifying step's tokens. Its positions
follow the history's length, its cache slots come from its block table, which the host sized for the longest the row can
be (core/device_verification.py). After sampling at every position, a row accepts the drafts up to the first that
differs from the token sampled before it, and appends the sampled tokens up to and including that one (the accepted
drafts and the bonus token) to its history: the next step reads them there.

On CUDA the layout (drafts included) and the acceptance are a kernel each (gpu/kernels/verify_layout.py), where torch
operations (`torch_lay_out`, `torch_accept`: the CPU's path and the kernels' reference) launch dozens.
The whole step is one function, `verify_step`, with no host sync: a verify graph (gpu/verify_graphs.py) captures it
per rows bucket and draft length, so such a step is a few inputs filled, one replay and the copies of its results;
the eager path (the CPU's, and any step no graph takes: the runner's rule) runs the same function, its forward in
the mixed-step graph that holds the step where one does (gpu/mixed_graphs.py, its inputs written over the host's
placeholders on the device).
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from gpu.attention.metadata import MAX_QUERIES_AS_ROWS, AttentionMetadata, QueryRows, query_rows_of_uniform_rows
from gpu.batch import Batch, RowSampling, StepResult
from gpu.host_to_device import to_device, write_block_tables
from gpu.pending_step import PendingStep, SampledRows
from gpu.token_history import HistoryFill, TokenHistory, torch_ngram_drafts


@dataclass(frozen=True)
class DeviceVerifyBatch:
    """What the host gives a verifying step laid out on the device: one row per running sequence."""

    slots: list[int]  # [num_rows] each row's token-history slot, distinct
    block_tables: list[list[int]]  # [num_rows][blocks]: covering every position the row may write
    sampling: list[RowSampling]  # [num_rows]: no seed, penalties or token mask (the same at every position)
    num_drafts: int  # k, the drafts every row verifies
    min_n: int  # the n-gram lengths of the lookup (speculative_config's prompt_lookup_min and _max)
    max_n: int
    max_context_len: int  # at least any row's context once the step's K/V are written
    fills: list[HistoryFill] = field(default_factory=list)  # written to the history first

    @property
    def num_rows(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class StepInputs:
    """What a step reads beside the history, on the device: per step the host's only inputs (a verify graph's static
    buffers, gpu/verify_graphs.py, or tensors copied for one eager step)."""

    slots: torch.Tensor  # [num_rows] int64, the rows' history slots (padding rows: the history's padding slot)
    num_blocks: torch.Tensor  # [num_rows] int64, the blocks of each row's table (0: a padding row, which keeps nothing)
    block_tables: torch.Tensor  # [num_rows, max_blocks] int32


@dataclass(frozen=True)
class StepShape:
    num_drafts: int  # k
    min_n: int  # the lookup's n-gram lengths
    max_n: int
    block_size: int
    max_context_len: int  # at least any row's context once the step's K/V are written


@dataclass(frozen=True)
class StepFunctions:
    """The model's part of a step: the forward, the logits of every position, and the draw of a token from each."""

    forward: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]  # -> [positions, hidden]
    logits: Callable[[torch.Tensor], torch.Tensor]  # hidden -> [positions, vocab]
    draw: Callable[[torch.Tensor], torch.Tensor]  # logits -> [positions] int64


@dataclass(frozen=True)
class VerifyInputs:
    token_ids: torch.Tensor  # [num_rows * (k + 1)] int64
    positions: torch.Tensor  # [num_rows * (k + 1)] int64
    meta: AttentionMetadata
    drafts: torch.Tensor  # [num_rows, k] int64
    num_drafts: torch.Tensor  # [num_rows] int64: k, or 0 where the lookup found nothing


@dataclass(frozen=True)
class VerifiedOutputs:
    """A step's results on the device."""

    token_ids: torch.Tensor  # [num_rows * (k + 1)] int64, sampled at every position, row after row
    counts: torch.Tensor  # [num_rows, 2] int64: each row's accepted drafts and verified drafts (k or 0)
    logits: torch.Tensor  # [num_rows * (k + 1), vocab]: the raw logits the tokens were drawn from

    def rows(self, num_rows: int) -> "VerifiedOutputs":
        num_positions = num_rows * (self.token_ids.shape[0] // self.counts.shape[0])
        return VerifiedOutputs(self.token_ids[:num_positions], self.counts[:num_rows], self.logits[:num_positions])


def verify_step(history: TokenHistory, inputs: StepInputs, shape: StepShape, model: StepFunctions
                ) -> VerifiedOutputs:
    """The whole step on the device, from the history to the history: drafts, layout, forward, draw, acceptance and
    the history's update. No host sync and no shape that depends on values, so a verify graph captures this very
    function (gpu/verify_graphs.py); the eager path runs it as it is."""
    laid_out = lay_out(history, inputs, shape)
    logits = model.logits(model.forward(laid_out.token_ids, laid_out.positions, laid_out.meta))
    token_ids = model.draw(logits)
    return VerifiedOutputs(token_ids, accept(history, inputs, laid_out, token_ids), logits)


def device_inputs(batch: DeviceVerifyBatch, device: torch.device) -> StepInputs:
    """The batch's inputs copied to the device for one eager step (two copies)."""
    tables = np.zeros((batch.num_rows, max(map(len, batch.block_tables))), dtype=np.int32)
    write_block_tables(tables, batch.block_tables)
    num_blocks = np.fromiter(map(len, batch.block_tables), dtype=np.int64, count=batch.num_rows)
    slots, num_blocks = to_device(np.concatenate([batch.slots, num_blocks]), np.int64, device).split(batch.num_rows)
    return StepInputs(slots, num_blocks, to_device(tables, np.int32, device))


def step_shape(batch: DeviceVerifyBatch, block_size: int) -> StepShape:
    return StepShape(batch.num_drafts, batch.min_n, batch.max_n, block_size, batch.max_context_len)


def lay_out(history: TokenHistory, inputs: StepInputs, shape: StepShape) -> VerifyInputs:
    """The step's inputs, computed on the device from the history (no host sync): on CUDA by one kernel
    (`kernel_lay_out`), elsewhere by `torch_lay_out`."""
    return (kernel_lay_out if history.device.type == "cuda" else torch_lay_out)(history, inputs, shape)


def kernel_lay_out(history: TokenHistory, inputs: StepInputs, shape: StepShape) -> VerifyInputs:
    """`lay_out` by gpu/kernels/verify_layout.py's kernel (on CUDA, or any device under Triton's interpreter)."""
    from gpu.kernels.verify_layout import fused_lay_out  # noqa: PLC0415 - Triton only where there is a GPU

    k = shape.num_drafts
    out = fused_lay_out(history.tokens, history.lengths, inputs.slots, inputs.num_blocks, inputs.block_tables, k,
                        shape.min_n, shape.max_n, shape.block_size, as_rows=k + 1 <= MAX_QUERIES_AS_ROWS)
    meta = AttentionMetadata(
        slot_mapping=out.slot_mapping, query_start_loc=out.query_start_loc, context_lens=out.context_lens,
        block_tables=inputs.block_tables, max_query_len=k + 1, max_context_len=shape.max_context_len,
        is_decode_only=False, query_rows=None if out.queries is None else QueryRows(*out.queries, k + 1))
    return VerifyInputs(out.token_ids, out.positions, meta, out.drafts, out.num_drafts)


def torch_lay_out(history: TokenHistory, inputs: StepInputs, shape: StepShape) -> VerifyInputs:
    """`lay_out` in torch operations (its lookup on CUDA gpu/kernels/ngram_drafts.py's, itself checked against
    core/ngram_proposer.py's): the CPU's path, and the layout kernel's reference."""
    device, k, block_size = history.device, shape.num_drafts, shape.block_size
    num_rows, max_blocks = inputs.block_tables.shape
    lengths = history.lengths[inputs.slots]
    drafts, num_drafts = _drafts(history.tokens[inputs.slots], lengths, shape)
    lengths = lengths.to(torch.int64)
    bonus = history.tokens[inputs.slots, torch.clamp(lengths - 1, min=0)].to(torch.int64)
    token_ids = torch.cat([bonus[:, None], drafts.to(torch.int64)], dim=1).reshape(-1)
    positions = (lengths[:, None] - 1 + torch.arange(k + 1, device=device)).reshape(num_rows, k + 1)
    block_index = positions // block_size
    is_covered = block_index < inputs.num_blocks[:, None]  # always, where the host reserved the row's blocks
    slot_mapping = inputs.block_tables.to(torch.int64).gather(1, torch.clamp(block_index, max=max_blocks - 1))
    slot_mapping = torch.where(is_covered, slot_mapping * block_size + positions % block_size, -1)  # -1: not written
    query_rows = query_rows_of_uniform_rows(positions, inputs.block_tables) if k + 1 <= MAX_QUERIES_AS_ROWS else None
    meta = AttentionMetadata(
        slot_mapping=slot_mapping.reshape(-1),
        query_start_loc=torch.arange(0, num_rows * (k + 1) + 1, k + 1, dtype=torch.int32, device=device),
        context_lens=(lengths + k).to(torch.int32), block_tables=inputs.block_tables, max_query_len=k + 1,
        max_context_len=shape.max_context_len, is_decode_only=False, query_rows=query_rows)
    return VerifyInputs(token_ids, positions.reshape(-1), meta, drafts.to(torch.int64), num_drafts.to(torch.int64))


def warm_up(history: TokenHistory, max_drafts: int, min_n: int, max_n: int, block_size: int) -> None:
    """The layout and acceptance run once on the padding slot (a row without blocks keeps nothing) at every draft length
    from 0 to `max_drafts`: on CUDA their kernels compile here, not in a request's step."""
    device = history.device
    inputs = StepInputs(torch.tensor([history.padding_slot], device=device), torch.zeros(1, dtype=torch.int64,
                        device=device), torch.zeros(1, 1, dtype=torch.int32, device=device))
    for k in range(max_drafts + 1):
        laid_out = lay_out(history, inputs, StepShape(k, min_n, max_n, block_size, history.max_model_len))
        accept(history, inputs, laid_out, laid_out.token_ids)


def host_shape(batch: DeviceVerifyBatch) -> Batch:
    """The step as a plain batch of placeholders but for its shape and block tables: what a mixed-step graph
    (gpu/mixed_graphs.py) is chosen and filled by before the device's values are written over it."""
    num_tokens = batch.num_rows * (batch.num_drafts + 1)
    return Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[-1] * num_tokens,
                 query_lens=[batch.num_drafts + 1] * batch.num_rows, context_lens=[0] * batch.num_rows,
                 block_tables=batch.block_tables)


def position_rows(batch: DeviceVerifyBatch) -> list[RowSampling]:
    """The sampling of each position, row after row (a row's k + 1 positions sample alike: no seed)."""
    width = batch.num_drafts + 1
    return [row for row in batch.sampling for _ in range(width)]


def num_accepted(sampled: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """[num_rows] the drafts each row accepts: its leading drafts that equal the token sampled at the position
    before each. sampled [R, k + 1], drafts [R, k], num_drafts [R]."""
    k = drafts.shape[1]
    is_equal = (drafts == sampled[:, :k]) & (torch.arange(k, device=drafts.device) < num_drafts[:, None])
    return is_equal.to(torch.int64).cumprod(dim=1).sum(dim=1)


def accept(history: TokenHistory, inputs: StepInputs, laid_out: VerifyInputs, token_ids: torch.Tensor
           ) -> torch.Tensor:
    """Accepts each row's drafts and appends its new tokens to the history (a padding row, without blocks, none);
    [num_rows, 2] int64: the accepted drafts and the verified drafts of each row. On CUDA one kernel
    (`kernel_accept`), elsewhere `torch_accept`."""
    return (kernel_accept if history.device.type == "cuda" else torch_accept)(history, inputs, laid_out, token_ids)


def kernel_accept(history: TokenHistory, inputs: StepInputs, laid_out: VerifyInputs, token_ids: torch.Tensor
                  ) -> torch.Tensor:
    """`accept` by gpu/kernels/verify_layout.py's kernel (on CUDA, or any device under Triton's interpreter)."""
    from gpu.kernels.verify_layout import fused_accept  # noqa: PLC0415 - Triton only where there is a GPU

    return fused_accept(history.tokens, history.lengths, history.max_model_len, inputs.slots, inputs.num_blocks,
                        token_ids, laid_out.drafts, laid_out.num_drafts)


def torch_accept(history: TokenHistory, inputs: StepInputs, laid_out: VerifyInputs, token_ids: torch.Tensor
                 ) -> torch.Tensor:
    """`accept` in torch operations: the CPU's path, and the kernel's reference."""
    tokens = token_ids.reshape(laid_out.drafts.shape[0], -1)
    accepted = num_accepted(tokens, laid_out.drafts, laid_out.num_drafts)
    history.append(inputs.slots, tokens, (accepted + 1) * (inputs.num_blocks > 0))
    return torch.stack([accepted, laid_out.num_drafts], dim=1)


class DeviceVerifiedStep:
    """A verifying step laid out on the device, on its way to the host: its result has k + 1 sampled tokens a row
    (`token_ids`, row after row) and each row's drafts and accepted drafts."""

    def __init__(self, sampled: SampledRows, counts: torch.Tensor) -> None:
        """`counts`: [num_rows, 2] on the device, VerifiedOutputs'."""
        self._counts = counts.to("cpu", non_blocking=True)  # queued before PendingStep records the event it waits on
        self._pending = PendingStep(sampled)

    def result(self) -> StepResult:
        result = self._pending.result()  # waits for the step, whose copies include the counts'
        accepted, drafts = self._counts.T.tolist()
        return replace(result, num_accepted=accepted, num_drafts=drafts)


def _drafts(rows: torch.Tensor, lengths: torch.Tensor, shape: StepShape) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k drafts and their count (k or 0), from its slot's tokens ([R, max_model_len + 1] int32)."""
    if not shape.num_drafts:  # a plain step laid out on the device: nothing to look up
        empty = torch.zeros(rows.shape[0], 0, dtype=torch.int32, device=rows.device)
        return empty, torch.zeros(rows.shape[0], dtype=torch.int32, device=rows.device)
    if rows.is_cuda:
        from gpu.kernels.ngram_drafts import ngram_drafts  # noqa: PLC0415 - Triton only where there is a GPU

        return ngram_drafts(rows, lengths, shape.num_drafts, shape.min_n, shape.max_n)
    return torch_ngram_drafts(rows, lengths, shape.num_drafts, shape.min_n, shape.max_n)
