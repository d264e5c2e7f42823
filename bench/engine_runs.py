"""Driving our engine for the benchmarks: a whole workload, batch-1 latency, and a short profile.

The engine is driven through its public loop (`add_request`, `step`, `has_unfinished_requests`),
as `LLM.generate` drives it but without the incremental detokenizer: token ids out, as from the
peer, so both sides do the same work. Time spent in the model runner is measured by the runner the
engine is built with (`LLMEngine(config, runner)`): a TimedRunner around the real one, built with
the kernel choices the run asks for.
"""

import contextlib
import gc
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import count

import torch

from bench.profiling import profile_summary
from bench.step_trace import StepRecord
from bench.workload import Request, fixed_workload
from core import EngineConfig, LLMEngine, SamplingParams
from core.engine import runner_config
from core.startup_gc import freeze_startup_objects
from gpu.batch import Batch, StepResult, TokenMask
from gpu.config import KernelConfig
from gpu.pending_step import PendingLogits, PendingStep
from gpu.runner import Runner
from gpu.runner_factory import AwaitingMasks, make_runner

TEMPERATURE = 0.6
_request_numbers = count()


@dataclass
class EngineRun:
    num_requests: int
    num_output_tokens: int
    seconds: float
    num_steps: int
    runner_seconds: float  # launching steps and waiting for their tokens (see TimedRunner)
    wait_seconds: float  # of which waiting for tokens: the host idle while the device works
    num_preemptions: int
    num_prefix_hit_tokens: int
    is_partial: bool = False  # stopped by max_seconds; tokens generated until then are counted

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


@dataclass
class RunnerTimes:
    """What a TimedRunner added up since a measurement began."""

    seconds: float = 0.0  # launching plus waiting
    wait_seconds: float = 0.0  # inside PendingStep.result(): the host blocked on the device
    num_calls: int = 0
    steps: list[StepRecord] = field(default_factory=list)  # every launched step, in order
    # CUDA events around every step's launch (StepRecord.device_events), read only after the run
    device_timeline: bool = False


class TimedRunner:
    """The model runner the benchmarks build the engine with: the real one, plus the host time spent queuing
    steps and waiting for their tokens. With async scheduling the engine waits for step N's tokens after queuing
    step N+1, so the rest of a step's wall time (scheduling, building the batch, postprocessing) overlaps the
    device's work."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.num_kv_blocks = runner.num_kv_blocks
        self.times = RunnerTimes()

    def measure(self, device_timeline: bool = False) -> RunnerTimes:
        """Starts a new tally and returns it; with `device_timeline` (on CUDA) each step is bracketed by CUDA events
        on the device's queue, so the run's device time splits into the steps' own and the device's idle time."""
        self.times = RunnerTimes(device_timeline=device_timeline and torch.cuda.is_available())
        return self.times

    def close(self) -> None:
        self.runner.close()

    def restarted(self) -> "TimedRunner":
        return TimedRunner(self.runner.restarted())

    def launch(self, batch: Batch) -> PendingStep | PendingLogits:
        times, start = self.times, time.perf_counter()
        record = StepRecord(batch, start)
        times.steps.append(record)
        try:
            if times.device_timeline:
                record.device_events = (_recorded_event(), _recorded_event())
            pending = self.runner.launch(batch)
            if times.device_timeline:
                record.device_events[1].record()
            return pending if isinstance(pending, AwaitingMasks) else _TimedPending(pending, times, record)
        finally:
            times.seconds += time.perf_counter() - start
            times.num_calls += 1

    def sample_masked(self, pending: PendingLogits, token_mask: TokenMask) -> PendingStep:
        """The sampling of a step with token masks (structured output), timed with its launch."""
        start, record = time.perf_counter(), self.times.steps[-1]
        try:
            sampled = self.runner.sample_masked(pending, token_mask)
            if record.device_events is not None:  # the step ends with its sampling
                record.device_events[1].record()
            return _TimedPending(sampled, self.times, record)
        finally:
            self.times.seconds += time.perf_counter() - start


@dataclass(frozen=True)
class TimedEngine:
    engine: LLMEngine
    runner: TimedRunner  # the engine's


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[int]:
    """While inside, what is alive now is out of the garbage collector's sight, as in a served engine once it has
    started (core/startup_gc.py); yields how many objects that is. At exit the heap is collectable again (a test
    process's)."""
    try:
        yield freeze_startup_objects()
    finally:
        gc.unfreeze()


def build_timed_engine(config: EngineConfig, kernels: KernelConfig) -> TimedEngine:
    runner = TimedRunner(make_runner(replace(runner_config(config), kernels=kernels)))
    return TimedEngine(LLMEngine(config, runner), runner)


def _recorded_event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class _TimedPending(PendingStep):
    def __init__(self, inner: PendingStep, times: RunnerTimes, record: StepRecord) -> None:
        self._inner = inner
        self._times = times
        self._record = record

    @property
    def sampled_token_ids(self) -> torch.Tensor | None:
        return self._inner.sampled_token_ids

    def result(self) -> StepResult:
        start = time.perf_counter()
        try:
            return self._inner.result()
        finally:
            elapsed = time.perf_counter() - start
            self._times.seconds += elapsed
            self._times.wait_seconds += elapsed
            self._record.wait += elapsed
            self._record.done_at = start + elapsed


def add_requests(engine: LLMEngine, requests: list[Request], seed: int | None = None) -> list[str]:
    ids = []
    for r in requests:
        request_id = f"bench-{next(_request_numbers)}"
        params = SamplingParams(temperature=TEMPERATURE, ignore_eos=True, max_tokens=r.max_tokens, seed=seed)
        engine.add_request(request_id, r.prompt_token_ids, params)
        ids.append(request_id)
    return ids


def run_workload(timed: TimedEngine, requests: list[Request], max_seconds: float | None = None,
                 trace: list[StepRecord] | None = None) -> EngineRun:
    """Generates the whole workload; past max_seconds the rest is aborted and the run marked partial.
    `trace`, when given, receives a record of every step the run launched (bench/step_trace.py)."""
    engine, times = timed.engine, timed.runner.measure(device_timeline=trace is not None)
    before = engine.stats()
    start = time.perf_counter()
    ids = add_requests(engine, requests)
    num_tokens, num_steps, is_partial = 0, 0, False
    while engine.has_unfinished_requests():
        if max_seconds is not None and not is_partial and time.perf_counter() - start > max_seconds:
            is_partial = True
            break
        num_tokens += sum(len(out.new_token_ids) for out in engine.step())
        num_steps += 1
    end = time.perf_counter()
    seconds = end - start
    if trace is not None:  # copies: the drain below collects the step still in flight of a partial run
        trace += [replace(r, done_at=r.done_at or end) for r in times.steps]
    if is_partial:
        drain(engine, ids)
    after = engine.stats()
    return EngineRun(
        num_requests=len(requests), num_output_tokens=num_tokens, seconds=seconds, num_steps=num_steps,
        runner_seconds=times.seconds, wait_seconds=times.wait_seconds,
        num_preemptions=after.num_preemptions - before.num_preemptions,
        num_prefix_hit_tokens=after.num_prefix_cache_hit_tokens - before.num_prefix_cache_hit_tokens,
        is_partial=is_partial,
    )


def drain(engine: LLMEngine, request_ids: list[str]) -> None:
    """Aborts the given requests and steps until the engine is idle (their blocks freed)."""
    for request_id in request_ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()


@dataclass(frozen=True)
class Batch1Latency:
    prompt_len: int
    num_output_tokens: int
    ttft_ms: float  # median over repeats
    tpot_ms: float  # median over repeats of (last token - first token) / (tokens - 1)
    tpot_samples_ms: list[float] = field(default_factory=list)
    runner_ms_per_step: float = 0.0  # launching and waiting for a step (see TimedRunner), over all measured steps
    gc_ms_total: float = 0.0  # Python garbage-collector pauses during the measured repeats


def time_batch1(timed: TimedEngine, prompt_len: int, num_tokens: int, repeats: int, seed: int) -> Batch1Latency:
    """One request at a time: a fresh random prompt each repeat, so no prefix-cache hit helps."""
    ttfts, tpots = [], []
    workload = fixed_workload(repeats + 1, prompt_len, num_tokens, seed=seed)
    _time_one(timed.engine, workload[0])  # warm-up
    times, gc_pauses = timed.runner.measure(), GcPauses()
    with gc_pauses:
        for request in workload[1:]:
            start, token_times = _time_one(timed.engine, request)
            ttfts.append((token_times[0] - start) * 1e3)
            tpots.append((token_times[-1] - token_times[0]) / (len(token_times) - 1) * 1e3)
    return Batch1Latency(prompt_len, num_tokens, round(statistics.median(ttfts), 3),
                         round(statistics.median(tpots), 4), [round(t, 4) for t in tpots],
                         round(times.seconds / times.num_calls * 1e3, 4), round(gc_pauses.seconds * 1e3, 2))


def _time_one(engine: LLMEngine, request: Request) -> tuple[float, list[float]]:
    """Runs one request alone; returns its start time and each token's arrival time."""
    start = time.perf_counter()
    add_requests(engine, [request])
    token_times: list[float] = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        token_times += [now] * sum(len(out.new_token_ids) for out in outputs)
    return start, token_times


class GcPauses:
    """Adds up the garbage collector's pauses while active (a context manager)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def profile_steps(engine: LLMEngine, requests: list[Request], skip_steps: int, num_steps: int) -> dict[str, object]:
    """torch.profiler over `num_steps` engine steps after `skip_steps`; the top ops by device and host time."""
    from torch.profiler import ProfilerActivity, profile

    ids = add_requests(engine, requests)
    for _ in range(skip_steps):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    step_seconds = []
    with profile(activities=activities) as prof:
        for _ in range(num_steps):
            start = time.perf_counter()
            engine.step()
            step_seconds.append(time.perf_counter() - start)
    running = engine.stats().num_running
    drain(engine, ids)
    return {"num_running": running, "num_steps": num_steps,
            "step_ms_median": round(statistics.median(step_seconds) * 1e3, 3),
            **profile_summary(prof.key_averages(), num_steps)}
