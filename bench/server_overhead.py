"""How much the HTTP/SSE side costs, and how much it delays the engine thread: a CPU-only harness.

The real server (openai_serve's app on uvicorn, in a subprocess) runs the real engine (scheduler,
block manager, batch building, postprocessing) on the built-in tiny model, with the model runner
replaced by `EmulatedRunner`: each step holds no GIL for a fixed "device" time (a sleep, as a GPU
sync is a blocking call that releases the GIL), then samples one token per row. So the only thing
between the server and the ideal of one step per `step_ms` is Python: the engine's own per-step
work and whatever the event loop thread makes it wait for.

Per level (streamed /v1/completions with prompts as token ids, ignore_eos, through bench.load):

- steps/s against the offline engine with the same emulated runner (no HTTP) and against 1/step_ms;
- the wake delay: from the end of the device time to the engine thread running Python again (a
  sleep that returns late because another thread holds the GIL; the offline run gives the OS's
  own share);
- the device's idle time per step: how long the emulated device waited for the host to queue the
  next step (the engine's Python, plus every wait for the GIL in it);
- the event loop thread's CPU per streamed token, and output tok/s.

    python -m bench.server_overhead --levels 64,256 --step-ms 10,20 --repeat 3 --out /tmp/server_overhead.json

Knobs for what-ifs: `--host-ms` (Python work the runner does per step, GIL held, as input preparation
and graph launches do), `--no-async-scheduling` (the engine waits for each step before the next),
`--switch-interval-ms` (the server process's sys.setswitchinterval). Results: bench/results/server_overhead.md.

uvicorn picks uvloop and httptools when they import; the GPU machine has uvloop but not httptools
(h11 parses HTTP there), so put only uvloop on PYTHONPATH to measure what it runs. Timer wake-ups on
a small VM can be late by milliseconds at random (the offline reference shows how much): compare
medians of several runs, interleaved with whatever they are compared against.
"""

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Never

from bench.common import write_result
from bench.load import RequestSpec, new_session, run_level
from bench.serve import free_port, process_cpu_seconds, stop, wait_for_health
from bench.stats import summarize
from core import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SamplingParams, SchedulerConfig
from gpu.batch import Batch, StepResult, TokenMask
from gpu.model_info import read_model_info

MODEL = "tiny"
_MAX_MODEL_LEN = 2048
_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass
class StepLog:
    """What the engine thread records each step; read by the loop thread (append-only lists)."""

    wake_delays: list[float] = field(default_factory=list)  # per step whose result the host waited for
    # Per step: how long the device sat idle before it (the host had not queued the step yet).
    device_idle: list[float] = field(default_factory=list)
    num_rows: list[int] = field(default_factory=list)
    engine_cpu_s: float = 0.0  # the engine thread's CPU time so far

    def snapshot(self) -> dict[str, object]:
        return {"num_steps": len(self.num_rows), "num_waits": len(self.wake_delays), "engine_cpu_s": self.engine_cpu_s}


class EmulatedStep:
    """A step on the emulated device: done at `done_at`; `result()` waits for it without the GIL."""

    def __init__(self, runner: "EmulatedRunner", done_at: float, token_ids: list[int]) -> None:
        self._runner = runner
        self._done_at = done_at
        self._token_ids = token_ids

    def result(self) -> StepResult:
        remaining = self._done_at - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
            # How late the engine thread runs again after the device finished: the OS's wake-up,
            # plus the wait for the GIL while another thread holds it.
            self._runner.log.wake_delays.append(time.perf_counter() - self._done_at)
        self._runner.log.engine_cpu_s = time.thread_time()
        return StepResult(self._token_ids, [None] * len(self._token_ids))


class EmulatedRunner:
    """Stands in for gpu.ModelRunner: a device that takes `step_s` per step, one step after another,
    and samples a random token per sampled row. Both of the runner's interfaces: `execute` (wait for
    the step) and `launch` (queue it; the engine waits later, overlapping its bookkeeping)."""

    def __init__(self, num_kv_blocks: int, vocab_size: int, step_s: float, host_s: float = 0.0) -> None:
        self.num_kv_blocks = num_kv_blocks
        self._vocab_size = vocab_size
        self._step_s = step_s
        self._host_s = host_s
        self._rng = random.Random(0)
        self._device_free_at: float | None = None
        self.log = StepLog()

    def execute(self, batch: Batch) -> StepResult:
        return self.launch(batch).result()

    def close(self) -> None:
        """Nothing to stop."""

    def restarted(self) -> "EmulatedRunner":
        return self

    def sample_masked(self, pending: Never, token_mask: TokenMask) -> EmulatedStep:
        """Never called: no emulated step waits for token masks (the workload asks for no structured output)."""
        raise AssertionError("the emulated runner's steps take no token masks")

    def launch(self, batch: Batch) -> EmulatedStep:
        _hold_the_gil(self._host_s)
        now = time.perf_counter()
        free_at = now if self._device_free_at is None else self._device_free_at
        if self.log.num_rows:  # the first step has no predecessor to be idle after
            self.log.device_idle.append(max(0.0, now - free_at))
        self._device_free_at = max(now, free_at) + self._step_s
        self.log.num_rows.append(batch.num_rows)
        num_sampled = sum(s is not None for s in batch.sampling)
        # Ids 0-2 are the special tokens; the rest detokenize to text as a real model's would.
        ids = [self._rng.randrange(3, self._vocab_size) for _ in range(num_sampled)]
        return EmulatedStep(self, self._device_free_at, ids)


def _hold_the_gil(seconds: float) -> None:
    """The runner's own Python before a launch (inputs, graph replay): the GIL held, as by any Python
    code, until the interpreter's switch interval makes it yield to a waiting thread."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def build_engine(args: argparse.Namespace, step_ms: float, max_num_seqs: int) -> tuple[LLMEngine, EmulatedRunner]:
    """The real engine on the tiny model's limits, built with the emulated runner instead of a model runner."""
    from core.tiny_model import tiny_model_dir

    model = str(tiny_model_dir())
    num_blocks = max_num_seqs * -(-(args.prompt_len + args.max_tokens) // 16) + 64
    sync = {"async_scheduling": False} if args.no_async_scheduling else {}
    config = EngineConfig(
        model=ModelConfig(model=model, device="cpu", max_model_len=_MAX_MODEL_LEN),
        cache=CacheConfig(block_size=16, num_blocks=num_blocks, enable_prefix_caching=True),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=_MAX_NUM_BATCHED_TOKENS, **sync),
    )
    runner = EmulatedRunner(num_blocks, read_model_info(model).vocab_size, step_ms / 1e3, args.host_ms / 1e3)
    return LLMEngine(config, runner), runner


def prompts(num: int, prompt_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Distinct random prompts (no prefix-cache hits), ids in the tiny model's vocabulary."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(prompt_len)] for _ in range(num)]


# The server side (a subprocess: its own interpreter, so its own GIL, as in production).


def serve(args: argparse.Namespace) -> None:
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from openai_serve.app import build_app
    from openai_serve.server import ServingServer
    from openai_serve.server_config import ServerConfig

    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    engine, runner = build_engine(args, args.step_ms, args.concurrency)
    log = runner.log
    config = ServerConfig(served_model_names=(MODEL,), port=args.port, log_level="warning")
    app = build_app(engine, config)

    async def stats(request: Request) -> JSONResponse:
        # Runs on the event loop thread: thread_time() here is that thread's CPU time. device_idle[i]
        # is the gap before step i + 1, so the gap before the level's first step is left out.
        start = int(request.query_params.get("since", "0"))
        return JSONResponse({
            **log.snapshot(), "loop_cpu_s": time.thread_time(), "process_cpu_s": time.process_time(),
            "wake_delays": log.wake_delays[int(request.query_params.get("since_wait", "0")):],
            "device_idle": log.device_idle[start:], "num_rows": log.num_rows[start:],
            "loop": type(asyncio.get_running_loop()).__module__,
            "switch_interval_s": sys.getswitchinterval(), "threads": threading.active_count(),
        })

    app.add_route("/bench/stats", stats, methods=["GET"])
    ServingServer(app, config).run()


# The driver side.


def offline_level(args: argparse.Namespace, concurrency: int, step_ms: float, num_requests: int) -> dict[str, object]:
    """The engine alone with the same emulated runner: the reference the server is measured against."""
    engine, runner = build_engine(args, step_ms, concurrency)
    log = runner.log
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.6)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts(num_requests, args.prompt_len, engine.vocab_size, args.seed)):
        engine.add_request(f"r{i}", prompt, params)
    num_tokens = 0
    while engine.has_unfinished_requests():
        num_tokens += sum(len(o.new_token_ids) for o in engine.step())
    duration = time.perf_counter() - start
    return {"duration_s": duration, "output_tokens_per_s": num_tokens / duration,
            **step_figures(log.wake_delays, log.device_idle, len(log.num_rows), duration, step_ms)}


def step_figures(delays: list[float], idle: list[float], num_steps: int, duration: float,
                 step_ms: float) -> dict[str, object]:
    return {
        "num_steps": num_steps, "steps_per_s": num_steps / duration, "ideal_steps_per_s": 1e3 / step_ms,
        "device_busy_share": round(num_steps * step_ms / 1e3 / duration, 3),
        "wake_delay_ms": ms_quantiles(delays), "device_idle_ms_per_step": ms_quantiles(idle),
    }


def ms_quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"mean": round(statistics.fmean(values) * 1e3, 3), "p50": round(pick(0.5) * 1e3, 3),
            "p90": round(pick(0.9) * 1e3, 3), "p99": round(pick(0.99) * 1e3, 3)}


def fetch_stats(base_url: str, since: int = 0, since_wait: int = 0) -> dict[str, object]:
    import urllib.request

    query = f"since={since}&since_wait={since_wait}"
    with urllib.request.urlopen(f"{base_url}/bench/stats?{query}", timeout=30) as response:
        return json.loads(response.read())


def server_level(args: argparse.Namespace, concurrency: int, step_ms: float, num_requests: int) -> dict[str, object]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bench.server_overhead", "--serve", "--port", str(port),
               "--step-ms", str(step_ms), "--concurrency", str(concurrency), "--host-ms", str(args.host_ms),
               "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens),
               *(["--no-async-scheduling"] if args.no_async_scheduling else []),
               *([] if args.switch_interval_ms is None else ["--switch-interval-ms", str(args.switch_interval_ms)])]
    process = subprocess.Popen(command)
    try:
        wait_for_health(base_url, process, 120)
        specs = [RequestSpec(base_url + "/v1/completions", request_body(args, p), args.max_tokens)
                 for p in prompts(num_requests + args.warmup_requests, args.prompt_len, 512, args.seed)]
        return asyncio.run(drive(args, base_url, specs, concurrency, step_ms, process.pid))
    finally:
        stop(process)


def request_body(args: argparse.Namespace, prompt: list[int]) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0.6,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def drive(args: argparse.Namespace, base_url: str, specs: list[RequestSpec], concurrency: int,
                step_ms: float, pid: int) -> dict[str, object]:
    warmup, specs = specs[: args.warmup_requests], specs[args.warmup_requests :]
    async with new_session(concurrency, 600) as session:
        await run_level(session, warmup, min(8, concurrency))
        before = await asyncio.to_thread(fetch_stats, base_url)
        cpu_before, client_before = process_cpu_seconds(pid), time.process_time()
        records, duration = await run_level(session, specs, concurrency)
        cpu_after, client_after = process_cpu_seconds(pid), time.process_time()
        after = await asyncio.to_thread(fetch_stats, base_url, before["num_steps"], before["num_waits"])
    summary = summarize(concurrency, records, duration)
    tokens = summary.num_output_tokens
    loop_cpu = after["loop_cpu_s"] - before["loop_cpu_s"]
    engine_cpu = after["engine_cpu_s"] - before["engine_cpu_s"]
    return {
        "duration_s": duration, "output_tokens_per_s": summary.output_tokens_per_s,
        "num_requests": summary.num_requests, "num_failed": summary.num_failed, "num_output_tokens": tokens,
        "itl_ms": summary.itl_ms, "tpot_ms": summary.tpot_ms,
        "tokens_per_text_chunk": round(tokens / max(1, sum(len(r.chunk_times) for r in records)), 3),
        **step_figures(after["wake_delays"], after["device_idle"], len(after["num_rows"]), duration, step_ms),
        "loop_cpu_us_per_token": round(loop_cpu / max(tokens, 1) * 1e6, 2),
        "loop_cpu_share": round(loop_cpu / duration, 3), "engine_cpu_share": round(engine_cpu / duration, 3),
        "server_cpu_share": None if cpu_before is None or cpu_after is None else round((cpu_after - cpu_before)
                                                                                         / duration, 3),
        "client_cpu_share": round((client_after - client_before) / duration, 3),
        "loop": after["loop"], "switch_interval_s": after["switch_interval_s"],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.server_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="64,256", help="concurrency levels (each also the engine's max_num_seqs)")
    p.add_argument("--step-ms", default="10,20", help="emulated device time per step: one, or one per level")
    p.add_argument("--num-requests", default=None, help="per level: one, or one per level (default 2 x concurrency)")
    p.add_argument("--warmup-requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host-ms", type=float, default=0.0,
                   help="Python work (GIL held) the emulated runner does per step before queuing it")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="the engine waits for each step's tokens before scheduling the next")
    p.add_argument("--switch-interval-ms", type=float, default=None,
                   help="the server process's GIL switch interval (sys.setswitchinterval; Python's default is 5)")
    p.add_argument("--repeat", type=int, default=1, help="runs per level (this machine's timer wake-ups are noisy)")
    p.add_argument("--no-offline", action="store_true", help="skip the offline reference")
    p.add_argument("--out", default=None)
    # The server subprocess.
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, default=256, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def per_level(spec: str | None, levels: list[int], default: list[float]) -> list[float]:
    values = default if spec is None else [float(x) for x in spec.split(",")]
    return values * len(levels) if len(values) == 1 else values


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.serve:
        args.step_ms = float(args.step_ms)
        serve(args)
        return
    levels = [int(x) for x in args.levels.split(",")]
    steps_ms = per_level(args.step_ms, levels, [])
    counts = [int(n) for n in per_level(args.num_requests, levels, [2 * c for c in levels])]
    results = []
    for concurrency, step_ms, num in zip(levels, steps_ms, counts, strict=True):
        runs = [run_level_pair(args, concurrency, step_ms, num) for _ in range(args.repeat)]
        level = {"concurrency": concurrency, "step_ms": step_ms, "runs": runs, "median": medians(runs)}
        print(format_level(level), flush=True)
        results.append(level)
    if args.out:
        write_result(args.out, {"kind": "server_overhead", "async_scheduling": not args.no_async_scheduling,
                                "levels": results}, "bench.server_overhead", argv)


def run_level_pair(args: argparse.Namespace, concurrency: int, step_ms: float, num: int) -> dict[str, object]:
    run: dict[str, object] = {"server": server_level(args, concurrency, step_ms, num)}
    if not args.no_offline:
        run["offline"] = offline_level(args, concurrency, step_ms, num)
    return run


# The figures each level's median line reports: (name, where in a run).
_SUMMARY = [
    ("server steps/s", ("server", "steps_per_s")), ("offline steps/s", ("offline", "steps_per_s")),
    ("server tok/s", ("server", "output_tokens_per_s")), ("offline tok/s", ("offline", "output_tokens_per_s")),
    ("wake delay mean ms", ("server", "wake_delay_ms", "mean")),
    ("offline wake delay mean ms", ("offline", "wake_delay_ms", "mean")),
    ("device idle mean ms/step", ("server", "device_idle_ms_per_step", "mean")),
    ("offline device idle mean ms/step", ("offline", "device_idle_ms_per_step", "mean")),
    ("loop us/token", ("server", "loop_cpu_us_per_token")),
]


def medians(runs: list[dict[str, object]]) -> dict[str, float]:
    out = {}
    for name, path in _SUMMARY:
        values = [v for run in runs if (v := _get(run, path)) is not None]
        if values:
            out[name] = round(statistics.median(values), 3)
    return out


def _get(run: dict[str, object], path: tuple[str, ...]) -> float | None:
    value: object = run
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value  # type: ignore[return-value]


def format_level(level: dict[str, object]) -> str:
    lines = [f"c={level['concurrency']} step={level['step_ms']} ms"]
    for run in level["runs"]:
        s = run["server"]
        lines.append(f"  server {s['steps_per_s']:.1f} steps/s (ideal {s['ideal_steps_per_s']:.1f}), "
                     f"{s['output_tokens_per_s']:.0f} tok/s, failed {s['num_failed']}, "
                     f"wake delay {s['wake_delay_ms']}, "
                     f"device idle ms/step {s['device_idle_ms_per_step']}, {s['tokens_per_text_chunk']} tokens/chunk, "
                     f"loop {s['loop_cpu_us_per_token']} us/token (cores: loop "
                     f"{s['loop_cpu_share']}, engine {s['engine_cpu_share']}, server {s['server_cpu_share']}, "
                     f"client {s['client_cpu_share']})")
        if "offline" in run:
            o = run["offline"]
            lines.append(f"  offline {o['steps_per_s']:.1f} steps/s, {o['output_tokens_per_s']:.0f} tok/s, wake delay "
                         f"{o['wake_delay_ms']}, device idle ms/step {o['device_idle_ms_per_step']}")
    lines.append(f"  median: {level['median']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
