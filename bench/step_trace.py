"""Where a timed run's wall time went, step by step, next to each step's own ideal time.

The runner timer keeps a `StepRecord` per launched step: its batch, when it was launched, how long
the host blocked on its tokens and when they arrived; the batch's shape (rows, new tokens, context
tokens) is read only after the run, so the timed loop pays nothing for it. A step's wall time runs
from the previous step's tokens reaching the host to its own (the first step's from its launch):
with async scheduling the device runs the steps back to back, so that is the step's device time
when the device is the bottleneck, and includes the host's delay when the host is. Each step's
ideal time is bench/roofline.py's bound for exactly that batch (its weights once, its context's K/V
once, its FLOPs), so the table says which kinds of steps lose the time: prefill-carrying steps, or
decode steps of few or many rows. `wait_s` is the host blocked on the device: a category whose wall
time is mostly waiting is device-bound, one with little waiting is held up by the host.

With a device timeline (CUDA events recorded around each step's launch, on the device's queue) the
wall time splits further: `device_s`, the device running the category's steps (first event to last
of each), and `device_idle_s`, the device idle before them (the previous step's last event to this
step's first): the host late with a step. Where wall time exceeds their sum, the tokens reached the
host after the device had finished (the host busy elsewhere).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.roofline import DeviceLimits, ModelShape, StepCost
from gpu.batch import Batch

if TYPE_CHECKING:
    import torch

# Decode-only steps are grouped by their number of rows: (label, most rows).
DECODE_ROW_BINS = (("decode 1-16 rows", 16), ("decode 17-64 rows", 64), ("decode 65-128 rows", 128),
                   ("decode 129-192 rows", 192), ("decode 193+ rows", 1 << 30))


@dataclass
class StepRecord:
    """One launched step, as the runner timer saw it (perf_counter seconds)."""

    batch: Batch
    launched_at: float
    wait: float = 0.0  # the host blocked on its tokens
    done_at: float | None = None  # its tokens reached the host; None: never collected (a partial run)
    # CUDA events recorded before its launch and after its last launch (a device timeline), else None
    device_events: "tuple[torch.cuda.Event, torch.cuda.Event] | None" = None


@dataclass(frozen=True)
class StepSample:
    """A step's shape, as its ideal cost needs it."""

    num_rows: int
    num_new_tokens: int
    num_sampled_rows: int
    num_context_tokens: int
    num_attention_pairs: int  # (query, context token) pairs, causal within each row's new tokens
    is_decode_only: bool


def sample_step(batch: Batch) -> StepSample:
    pairs = sum(q * c - q * (q - 1) // 2 for q, c in zip(batch.query_lens, batch.context_lens, strict=True))
    return StepSample(
        num_rows=batch.num_rows, num_new_tokens=sum(batch.query_lens),
        num_sampled_rows=sum(s is not None for s in batch.sampling), num_context_tokens=sum(batch.context_lens),
        num_attention_pairs=pairs, is_decode_only=batch.is_decode_only,
    )


def step_cost(shape: ModelShape, s: StepSample) -> StepCost:
    """The least bytes and FLOPs of one step: weights once, each context token's K/V read once, new K/V written."""
    num_bytes = shape.weight_bytes_per_step + (s.num_context_tokens + s.num_new_tokens) * shape.kv_bytes_per_token
    flops = (s.num_new_tokens * shape.linear_flops_per_token + s.num_sampled_rows * shape.lm_head_flops_per_row
             + s.num_attention_pairs * shape.attention_flops_per_pair)
    return StepCost(num_bytes, flops)


def category(s: StepSample) -> str:
    if not s.is_decode_only:
        return "with prefill"
    return next(label for label, most in DECODE_ROW_BINS if s.num_rows <= most)


_TOTALS = ("steps", "rows", "context", "wall", "ideal", "wait", "device", "idle")


def breakdown(records: list[StepRecord], shape: ModelShape, limits: DeviceLimits) -> list[dict[str, object]]:
    """Per category: steps, rows and context per step, wall and ideal seconds, their ratio, host wait.
    Steps are collected in launch order; every record has its done_at (run_workload sets it)."""
    totals: dict[str, dict[str, float]] = {}
    begin = records[0].launched_at if records else 0.0
    device_times = device_timeline(records)
    for index, record in enumerate(records):
        s, done = sample_step(record.batch), record.done_at
        assert done is not None, "a step record without done_at"
        t = totals.setdefault(category(s), dict.fromkeys(_TOTALS, 0.0))
        t["steps"] += 1
        t["rows"] += s.num_rows
        t["context"] += s.num_context_tokens
        t["wall"] += done - begin
        t["ideal"] += step_cost(shape, s).seconds(limits)
        t["wait"] += record.wait
        if device_times is not None:
            t["device"] += device_times[index][0]
            t["idle"] += device_times[index][1]
        begin = done
    order = ["with prefill"] + [label for label, _ in DECODE_ROW_BINS]
    return [{
        "category": name, "steps": int(t["steps"]), "rows_per_step": round(t["rows"] / t["steps"], 1),
        "context_per_row": round(t["context"] / max(t["rows"], 1), 1), "wall_s": round(t["wall"], 4),
        "ideal_s": round(t["ideal"], 4), "share_of_ideal": round(t["ideal"] / t["wall"], 4) if t["wall"] else None,
        "wait_s": round(t["wait"], 4), "ms_per_step": round(t["wall"] / t["steps"] * 1e3, 3),
        **({} if device_times is None else {
            "device_s": round(t["device"], 4), "device_idle_s": round(t["idle"], 4),
            "device_ms_per_step": round(t["device"] / t["steps"] * 1e3, 3)}),
    } for name in order if (t := totals.get(name))]


def device_timeline(records: list[StepRecord]) -> list[tuple[float, float]] | None:
    """Per step, seconds the device ran it and seconds it sat idle before it (0 for the first); None unless every
    record carries its events. Synchronizes once, so call it after the run."""
    if not records or any(r.device_events is None for r in records):
        return None
    records[-1].device_events[1].synchronize()  # type: ignore[index]
    times, previous_end = [], None
    for record in records:
        start, end = record.device_events  # type: ignore[misc]
        idle = previous_end.elapsed_time(start) / 1e3 if previous_end is not None else 0.0
        times.append((start.elapsed_time(end) / 1e3, max(idle, 0.0)))
        previous_end = end
    return times
