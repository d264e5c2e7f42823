"""Driving our engine for the benchmarks through its public loop, token ids out: a whole workload, and one request
at a time (batch-1 latency). A run's kernel choices build its runner (`LLMEngine(config, runner)`), never a switch
flipped on a live one.
"""

import contextlib
import gc
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import count

from bench.workload import Request, fixed_workload
from core import EngineConfig, LLMEngine, SamplingParams
from core.engine import runner_config
from core.startup_gc import freeze_startup_objects
from gpu.config import KernelConfig
from gpu.runner_factory import make_runner

TEMPERATURE = 0.6
_request_numbers = count()


def build_engine(config: EngineConfig, kernels: KernelConfig) -> LLMEngine:
    return LLMEngine(config, make_runner(replace(runner_config(config), kernels=kernels)))


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[int]:
    """While inside, what is alive now is out of the garbage collector's sight, as in a served engine once it has
    started (core/startup_gc.py); yields how many objects that is. At exit the heap is collectable again."""
    try:
        yield freeze_startup_objects()
    finally:
        gc.unfreeze()


@dataclass
class EngineRun:
    num_requests: int
    num_output_tokens: int
    seconds: float
    num_steps: int
    num_preemptions: int
    num_prefix_hit_tokens: int
    is_partial: bool = False  # stopped by max_seconds; tokens generated until then are counted

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def add_requests(engine: LLMEngine, requests: list[Request], temperature: float = TEMPERATURE) -> list[str]:
    ids = []
    for r in requests:
        request_id = f"bench-{next(_request_numbers)}"
        engine.add_request(request_id, r.prompt_token_ids,
                           SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=r.max_tokens))
        ids.append(request_id)
    return ids


def run_workload(engine: LLMEngine, requests: list[Request], max_seconds: float | None = None) -> EngineRun:
    """Generates the whole workload; past max_seconds the rest is aborted and the run marked partial."""
    before = engine.stats()
    start = time.perf_counter()
    ids = add_requests(engine, requests)
    num_tokens, num_steps, is_partial = 0, 0, False
    while engine.has_unfinished_requests():
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            is_partial = True
            break
        num_tokens += sum(len(out.new_token_ids) for out in engine.step())
        num_steps += 1
    seconds = time.perf_counter() - start
    for request_id in ids if is_partial else []:  # the rest aborted; stepped until their blocks are free
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    after = engine.stats()
    return EngineRun(num_requests=len(requests), num_output_tokens=num_tokens, seconds=seconds, num_steps=num_steps,
                     num_preemptions=after.num_preemptions - before.num_preemptions,
                     num_prefix_hit_tokens=after.num_prefix_cache_hit_tokens - before.num_prefix_cache_hit_tokens,
                     is_partial=is_partial)


@dataclass(frozen=True)
class Batch1Latency:
    prompt_len: int
    num_output_tokens: int
    ttft_ms: float  # median over repeats
    tpot_ms: float  # median over repeats of (last token - first token) / (tokens - 1)


def time_batch1(engine: LLMEngine, prompt_len: int, num_tokens: int, repeats: int, seed: int) -> Batch1Latency:
    """One request at a time: a fresh random prompt each repeat, so no prefix-cache hit helps."""
    ttfts, tpots = [], []
    workload = fixed_workload(repeats + 1, prompt_len, num_tokens, seed=seed)
    time_one(engine, workload[0])  # warm-up
    for request in workload[1:]:
        start, token_times = time_one(engine, request)
        ttfts.append((token_times[0] - start) * 1e3)
        tpots.append((token_times[-1] - token_times[0]) / (len(token_times) - 1) * 1e3)
    return Batch1Latency(prompt_len, num_tokens, round(statistics.median(ttfts), 3), round(statistics.median(tpots), 4))


def time_one(engine: LLMEngine, request: Request, temperature: float = TEMPERATURE) -> tuple[float, list[float]]:
    """Runs one request alone; returns its start time and each token's arrival time."""
    start = time.perf_counter()
    add_requests(engine, [request], temperature)
    token_times: list[float] = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        token_times += [now] * sum(len(out.new_token_ids) for out in outputs)
    return start, token_times
