"""A launched step's sampled tokens on their way to the host.

The runner queues a step's work and returns at once; the copy of its results to the host is queued
behind it. `result()` is the step's one host sync: the engine calls it only after it has queued
the next step, so the device never waits for the host's bookkeeping in between.
"""

from dataclasses import dataclass, replace

import torch

from gpu.batch import PenaltySlotInit, RowSampling, StepResult, TokenLogprobs
from gpu.prompt_logprobs import PackedPromptLogprobs


@dataclass(frozen=True)
class SampledRows:
    """One step's sampling result, still on the device."""

    token_ids: torch.Tensor  # [num_rows] int64
    # [num_rows, 3 + 2 * num_top] float64: token id, its logprob, its rank, top ids, top logprobs;
    # None when no row asked for logprobs.
    packed_logprobs: torch.Tensor | None
    num_top_logprobs: list[int | None]  # per row, as asked


@dataclass(frozen=True)
class PendingLogits:
    """A launched step's logits (on the device) waiting for token masks before they are sampled."""

    logits: torch.Tensor  # [num_sampled_rows, vocab]
    rows: list[RowSampling]
    slot_inits: list[PenaltySlotInit]
    prompt: PackedPromptLogprobs | None = None


class PendingStep:
    def __init__(self, sampled: SampledRows | None, prompt: PackedPromptLogprobs | None = None) -> None:
        self._sampled = sampled
        self._prompt = prompt
        self._host: torch.Tensor | None = None
        self._prompt_host: torch.Tensor | None = None
        self._ready: torch.cuda.Event | None = None
        sources = [] if prompt is None else [prompt.packed]
        if prompt is not None:
            self._prompt_host = prompt.packed.to("cpu", non_blocking=True)
        if sampled is not None:
            source = sampled.token_ids if sampled.packed_logprobs is None else sampled.packed_logprobs
            # A non-blocking copy from the GPU lands in pinned memory; the event says when it has.
            self._host = source.to("cpu", non_blocking=True)
            sources.append(source)
        if sources and sources[0].is_cuda:
            self._ready = torch.cuda.Event()
            self._ready.record()

    @property
    def sampled_token_ids(self) -> torch.Tensor | None:
        """[num_rows] on the device: the next step can read them before the host has them."""
        return None if self._sampled is None else self._sampled.token_ids

    def result(self) -> StepResult:
        if self._ready is not None:
            self._ready.synchronize()  # releases the GIL while it waits
        if self._sampled is None or self._host is None:
            result = StepResult([], [])
        elif self._sampled.packed_logprobs is None:
            result = StepResult(self._host.tolist(), [None] * len(self._sampled.num_top_logprobs))
        else:
            result = _unpack(self._host.tolist(), self._sampled.num_top_logprobs)
        if self._prompt is not None and self._prompt_host is not None:
            result = replace(result, prompt_logprobs=_unpack_prompt(self._prompt_host.tolist(), self._prompt))
        return result


def feed_back_tokens(input_ids: torch.Tensor, token_indices: torch.Tensor, source_rows: torch.Tensor,
                     last_sampled_ids: torch.Tensor | None) -> None:
    """input_ids[token_indices] = the previous step's sampled tokens of `source_rows`, on the device."""
    assert last_sampled_ids is not None, "a batch feeds back tokens but no step sampled any"
    input_ids[token_indices] = last_sampled_ids[source_rows]


def _unpack_prompt(packed: list[list[float]], prompt: PackedPromptLogprobs) -> list[list[TokenLogprobs]]:
    num_top = max(prompt.num_tops)
    rows, start = [], 0
    for count, n in zip(prompt.counts, prompt.num_tops, strict=True):
        rows.append([_token_logprobs(row, n, num_top) for row in packed[start : start + count]])
        start += count
    return rows


def _unpack(packed: list[list[float]], wanted: list[int | None]) -> StepResult:
    num_top = max(n or 0 for n in wanted)
    results = [None if n is None else _token_logprobs(row, n, num_top) for row, n in zip(packed, wanted, strict=True)]
    return StepResult([int(row[0]) for row in packed], results)


def _token_logprobs(row: list[float], n: int, num_top: int) -> TokenLogprobs:
    """One packed row: token id, its logprob, its rank, num_top ids, num_top logprobs (n of them wanted)."""
    return TokenLogprobs(logprob=row[1], rank=int(row[2]), top_token_ids=tuple(int(t) for t in row[3 : 3 + n]),
                         top_logprobs=tuple(row[3 + num_top : 3 + num_top + n]))
