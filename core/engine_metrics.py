"""What the engine measures for the server's /metrics and its stats log line, gathered cheaply.

Two kinds of figures, both as vLLM defines them:
- counters that only grow (prompt and generated tokens, prefix-cache queries and hits, finished
  requests); they ride in EngineStats, so the last stats the server has are current;
- timings of request phases, handed over as observations since the last hand-over:
  queue = first scheduled - arrival at the engine; prefill = first token - first scheduled;
  decode = finished - first token; inference = finished - first scheduled; and the
  inter-token latency.

Hot path: one clock read per step, and per sampled token one comparison (is it its request's first
token?). Inter-token latency is one (interval, count) pair per step: every token of a step that is
not its request's first came one step interval after its request's previous token, because every
running request samples in every step. Departure from vLLM, which times each request's own gap: a
request back from a preemption counts the step interval, not its gap.
"""

import time
from typing import NamedTuple

from core.sequence import Sequence


class EngineObservations(NamedTuple):
    """Timings (seconds) observed since the last hand-over. A tuple: it crosses the process pipe."""

    queue_times: list[float]
    prefill_times: list[float]
    decode_times: list[float]
    inference_times: list[float]
    inter_token_latencies: list[tuple[float, int]]  # (interval, number of tokens that waited that long)

    @classmethod
    def empty(cls) -> "EngineObservations":
        return cls([], [], [], [], [])

    def extend(self, other: "EngineObservations") -> None:
        for mine, theirs in zip(self, other, strict=True):
            mine.extend(theirs)

    def __bool__(self) -> bool:
        return any(len(values) for values in self)


class EngineMetrics:
    """Counts and times what the engine does; owned and driven by the engine's one thread."""

    def __init__(self) -> None:
        self.num_prompt_tokens = 0  # of requests whose prefill finished (their first token came)
        self.num_generation_tokens = 0
        self._observations = EngineObservations.empty()
        self._last_tokens_time: float | None = None

    def on_admitted(self, seq: Sequence, now: float) -> None:
        """A request enters the running batch (again, after a preemption: then nothing changes)."""
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
            self._observations.queue_times.append(now - seq.arrival_time)

    def on_tokens(self, first_token_seqs: list[Sequence], num_tokens: int, now: float) -> None:
        """One step's tokens reached the host: `num_tokens` in all, the first ones of `first_token_seqs`."""
        for seq in first_token_seqs:
            self.num_prompt_tokens += seq.num_prompt_tokens
            if seq.first_scheduled_time is not None:
                self._observations.prefill_times.append(now - seq.first_scheduled_time)
        num_later_tokens = num_tokens - len(first_token_seqs)
        if num_later_tokens and self._last_tokens_time is not None:
            self._observations.inter_token_latencies.append((now - self._last_tokens_time, num_later_tokens))
        self.num_generation_tokens += num_tokens
        self._last_tokens_time = now

    def on_pooled(self, seqs: list[Sequence], now: float) -> None:
        """Pooling requests got their output: their prompt counts, their prefill ends (nothing is generated)."""
        for seq in seqs:
            self.num_prompt_tokens += seq.num_prompt_tokens
            if seq.first_scheduled_time is not None:
                self._observations.prefill_times.append(now - seq.first_scheduled_time)

    def on_finished(self, seq: Sequence) -> None:
        now = time.monotonic()
        if seq.first_scheduled_time is not None:
            self._observations.inference_times.append(now - seq.first_scheduled_time)
        if seq.first_token_time is not None:
            self._observations.decode_times.append(now - seq.first_token_time)

    def take_observations(self) -> EngineObservations | None:
        """What was observed since the last call; None if nothing."""
        if not self._observations:
            return None
        taken, self._observations = self._observations, EngineObservations.empty()
        return taken
