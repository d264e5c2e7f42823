"""Online serving benchmark: streamed /v1/completions at several concurrency levels, over HTTP/SSE.

Talks to any OpenAI-compatible server (`--base-url`), or starts one itself: `--launch` runs
`python -m openai_serve` with `--server-args` on a free port, `--launch-cmd` runs any command with
`{port}` in it; either way it waits for GET /health to answer 200 and stops the server at the end.

Every request sends a prompt of `--prompt-len` random token ids (distinct prompts, so no prefix
cache helps; as text with `--prompt-format text`, decoded with `--tokenizer`) and asks for
`--max-tokens` tokens with ignore_eos. Per level: TTFT, TPOT and ITL p50/p99 (ITL's max too), E2E p50, request/s,
output tok/s and failed requests (bench/stats.py defines them). The client's own CPU share is
recorded per level: near 1.0 the client, not the server, would be the bottleneck.

    python -m bench.serve --launch --server-args "--model DIR --max-model-len 4096" --out result.json
"""

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from functools import partial
from pathlib import Path

from bench.common import write_result
from bench.load import RequestSpec, new_session, poisson_arrivals, run_level
from bench.stats import LevelSummary, summarize
from bench.workload import fixed_workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000")
    target.add_argument("--launch", action="store_true", help="start openai-serve (python -m openai_serve)")
    target.add_argument("--launch-cmd", help="start this server command; '{port}' is replaced by a free port")
    p.add_argument("--server-args", default="", help="flags for openai-serve with --launch")
    p.add_argument("--server-log", default=None, help="file for the launched server's output")
    p.add_argument("--health-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--label", default=None, help="the server's name in the results (default: from how it runs)")
    p.add_argument("--model", default=None, help="'model' in requests (default: the first of GET /v1/models)")
    p.add_argument("--levels", default="1,16,64,256", help="max concurrency levels, comma-separated")
    p.add_argument("--num-requests", default=None,
                   help="requests per level: one number, or one per level, comma-separated "
                   "(default: max(32, 4 x concurrency))")
    p.add_argument("--request-rate", default=None,
                   help="requests per second arriving as a Poisson process (as vLLM's serving benchmark), each level "
                   "still capped at its concurrency: one number, or one per level, comma-separated (default: a "
                   "closed loop, a new request as soon as one ends)")
    p.add_argument("--max-seconds-per-level", type=float, default=None,
                   help="no new request starts after this long in a level (those in flight finish)")
    p.add_argument("--warmup-requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--prompt-format", choices=["ids", "text"], default="ids")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for --prompt-format text")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="leave ignore_eos out (servers that reject it); the token count is then not enforced")
    p.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--read-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None, help="write the result JSON here")
    return p.parse_args(argv)


def requests_per_level(levels: list[int], spec: str | None) -> list[int]:
    if spec is None:
        return [max(32, 4 * c) for c in levels]
    return [int(x) for x in per_level(levels, spec, "--num-requests")]


def rates_per_level(levels: list[int], spec: str | None) -> list[float | None]:
    """Each level's --request-rate; None: a closed loop."""
    if spec is None:
        return [None] * len(levels)
    return [float(x) for x in per_level(levels, spec, "--request-rate")]


def per_level(levels: list[int], spec: str, flag: str) -> list[str]:
    """One value for every level, or one per level, comma-separated."""
    values = spec.split(",")
    if len(values) == 1:
        return values * len(levels)
    if len(values) != len(levels):
        raise ValueError(f"{flag} has {len(values)} numbers for {len(levels)} levels")
    return values


class RequestFactory:
    """Builds the request specs of one level; each level draws its own prompts (seed + level)."""

    def __init__(self, args: argparse.Namespace, base_url: str, model: str) -> None:
        self.args = args
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.extra = json.loads(args.extra_body)
        self.tokenizer = None
        if args.prompt_format == "text":
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

    def specs(self, num_requests: int, seed: int) -> list[RequestSpec]:
        a = self.args
        workload = fixed_workload(num_requests, a.prompt_len, a.max_tokens, seed=seed)
        return [self._spec(r.prompt_token_ids) for r in workload]

    def _spec(self, prompt_ids: list[int]) -> RequestSpec:
        a = self.args
        prompt: object = prompt_ids if self.tokenizer is None else self.tokenizer.decode(prompt_ids)
        body: dict[str, object] = {
            "model": self.model, "prompt": prompt, "max_tokens": a.max_tokens, "temperature": a.temperature,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if not a.no_ignore_eos:
            body["ignore_eos"] = True
        return RequestSpec(self.url, {**body, **self.extra}, None if a.no_ignore_eos else a.max_tokens)


async def run_all(
    args: argparse.Namespace, base_url: str, model: str,
    on_level: Callable[[list[dict[str, object]]], None], server_cpu: Callable[[], float | None],
) -> list[dict[str, object]]:
    """Runs every level in order; `on_level` gets the levels done so far after each one.

    `server_cpu` gives the server process's CPU seconds so far (all its threads), None when unknown.
    """
    levels = [int(x) for x in args.levels.split(",")]
    rates = rates_per_level(levels, args.request_rate)
    factory = RequestFactory(args, base_url, model)
    results = []
    async with new_session(max(levels), args.read_timeout) as session:
        if args.warmup_requests:
            warm, _ = await run_level(session, factory.specs(args.warmup_requests, args.seed + 10**6), 8)
            print(f"warm-up: {sum(r.is_ok for r in warm)}/{len(warm)} ok", flush=True)
        for index, (concurrency, num) in enumerate(zip(levels, requests_per_level(levels, args.num_requests),
                                                         strict=True)):
            specs = factory.specs(num, args.seed + 1000 * index + concurrency)  # a level repeated gets new prompts
            rate = rates[index]
            arrivals = None if rate is None else poisson_arrivals(num, rate, args.seed + index)
            deadline = None if args.max_seconds_per_level is None else time.perf_counter() + args.max_seconds_per_level
            cpu_start, server_cpu_start = time.process_time(), server_cpu()
            records, duration = await run_level(session, specs, concurrency, deadline, arrivals)
            summary = summarize(concurrency, records, duration)
            server_cpu_end = server_cpu()
            level = {**asdict(summary), "num_requests_planned": num, "request_rate": rate,
                     "client_cpu_share": round((time.process_time() - cpu_start) / duration, 3),
                     "server_cpu_share": None if server_cpu_start is None or server_cpu_end is None
                     else round((server_cpu_end - server_cpu_start) / duration, 3),
                     "errors": sorted({r.error for r in records if r.error})[:5],
                     # The level's first request: with no warm-up requests, the server's first.
                     "first_ttft_ms": round(records[0].ttft * 1e3, 2) if records and records[0].is_ok else None}
            print(format_level(summary) + ("" if rate is None else f"  (Poisson arrivals at {rate:g}/s)"), flush=True)
            results.append(level)
            on_level(results)
    return results


def format_level(s: LevelSummary) -> str:
    return (f"c={s.concurrency:<4} n={s.num_requests:<5} failed={s.num_failed:<3} {s.output_tokens_per_s:>9.1f} tok/s "
            f"{s.request_per_s:>7.2f} req/s  TTFT p50/p99 {s.ttft_ms['p50']:.1f}/{s.ttft_ms['p99']:.1f} ms  "
            f"TPOT {s.tpot_ms['p50']:.2f}/{s.tpot_ms['p99']:.2f} ms  ITL p50/p99/max {s.itl_ms['p50']:.2f}/"
            f"{s.itl_ms['p99']:.2f}/{s.itl_ms['max']:.0f} ms  E2E p50 {s.e2e_ms['p50']:.0f} ms")


# The server under test.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_command(args: argparse.Namespace, port: int) -> list[str]:
    if args.launch_cmd:
        return shlex.split(args.launch_cmd.replace("{port}", str(port)))
    return [sys.executable, "-m", "openai_serve", *shlex.split(args.server_args),
            "--host", "127.0.0.1", "--port", str(port)]


def wait_for_health(base_url: str, process: subprocess.Popen[bytes] | None, timeout_s: float) -> float:
    """Polls GET /health until 200; returns the seconds it took. Raises if the server died or never came up."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before /health answered")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"/health did not answer 200 within {timeout_s:.0f} s")


def first_model(base_url: str) -> str:
    with urllib.request.urlopen(base_url + "/v1/models", timeout=30) as response:
        return str(json.loads(response.read())["data"][0]["id"])


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process and its live descendants (an engine process, say), all
    threads (Linux /proc); None where the process is unknown."""
    if pid is None:
        return None
    own = _own_cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(_own_cpu_seconds(child) or 0.0 for child in _descendants(pid))


def _own_cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the ")" that ends the command name: field 3 is the state, so utime and stime (14, 15) sit at 11, 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return children + [d for c in children for d in _descendants(c)]


def label_of(args: argparse.Namespace) -> str:
    if args.label:
        return args.label
    return "openai-serve" if args.launch else (args.launch_cmd or args.base_url).split()[0]


@contextmanager
def launched(command: list[str], port: int, log_path: str | None, health_timeout_s: float
             ) -> Iterator[tuple[str, subprocess.Popen[bytes], dict[str, object]]]:
    """A server started with `command` on `port`, ready when GET /health answers 200: (its base URL, its process, how
    it was started). Stopped on the way out; SIGTERM (a `timeout` around the run) unwinds through here."""
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open(log_path or os.devnull, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}"
            startup_s = wait_for_health(base_url, process, health_timeout_s)
            yield base_url, process, {"command": " ".join(shlex.quote(c) for c in command),
                                      "startup_s": round(startup_s, 1)}
        finally:
            stop(process)
            signal.signal(signal.SIGTERM, previous_handler)  # as it was, for callers that run main() in-process


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.base_url:
        run(args, argv, args.base_url.rstrip("/"), None, {"label": label_of(args)})
        return
    port = free_port()
    with launched(launch_command(args, port), port, args.server_log, args.health_timeout) as (url, process, info):
        run(args, argv, url, process, {"label": label_of(args), **info})


def run(args: argparse.Namespace, argv: list[str], base_url: str, process: subprocess.Popen[bytes] | None,
        server: dict[str, object]) -> None:
    """Every level against one server; the result file is rewritten after each level, so a run cut short keeps
    the levels it finished."""
    if process is None:
        server["startup_s"] = round(wait_for_health(base_url, None, args.health_timeout), 1)
    server["model"] = model = args.model or first_model(base_url)
    save = partial(save_result, args, argv, server)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        levels = runner.run(run_all(args, base_url, model, partial(save, is_complete=False),
                                    partial(process_cpu_seconds, process.pid if process else None)))
    save(levels, is_complete=True)


def save_result(args: argparse.Namespace, argv: list[str], server: dict[str, object],
                levels: list[dict[str, object]], is_complete: bool) -> None:
    """Written after every level, so a run cut short still leaves the levels it finished."""
    if not args.out:
        return
    config = {k: getattr(args, k) for k in ("prompt_len", "max_tokens", "temperature", "prompt_format", "seed",
                                            "warmup_requests", "max_seconds_per_level", "extra_body")}
    config["ignore_eos"] = not args.no_ignore_eos
    write_result(args.out, {"kind": "serve", "server": server, "config": config, "levels": levels,
                            "is_complete": is_complete}, "bench.serve", argv)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed: a lighter client loop."""
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:
        return None


if __name__ == "__main__":
    main()
