"""Online serving benchmark: streamed /v1/completions at several concurrency levels, over HTTP/SSE.

Measures any OpenAI-compatible server (`--base-url`), or starts openai-serve itself (`--launch`, with `--server-args`)
on a free port, waits for GET /health to answer 200 and stops it at the end. Every request sends a prompt of
`--prompt-len` random token ids (distinct prompts, so no prefix cache helps) and asks for `--max-tokens` tokens with
ignore_eos, in a closed loop (a new request as one ends). Per level: TTFT, TPOT, ITL, E2E, request/s, output
tok/s and failed requests (bench/stats.py defines them), the client's own CPU share (near 1.0 the client, not the
server, would be the bottleneck), and from the server's /metrics, read before and after the level, its prompt tokens
and its prefix cache's hit rate (in tokens).

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
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from functools import partial

from bench.common import write_result
from bench.load import RequestSpec, new_session, run_conversations
from bench.stats import RequestRecord, ms_percentiles, summarize
from bench.workload import fixed_workload


def add_server_args(p: argparse.ArgumentParser, levels: str) -> None:
    """The flags bench.serve and bench.prefix_serve share: the server under test, the levels, the requests."""
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000")
    target.add_argument("--launch", action="store_true", help="start openai-serve (python -m openai_serve)")
    p.add_argument("--server-args", default="", help="flags for openai-serve with --launch")
    p.add_argument("--health-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--model", default=None, help="'model' in requests (default: the first of GET /v1/models)")
    p.add_argument("--levels", default=levels, help="max concurrency levels, comma-separated")
    p.add_argument("--max-seconds-per-level", type=float, default=None,
                   help="nothing new starts after this long in a level (what is in flight finishes)")
    p.add_argument("--warmup-requests", type=int, default=8, help="requests of distinct random prompts first")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--read-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None, help="the result JSON, written after every level")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n\n")[0])
    add_server_args(p, "1,16,64,256")
    p.add_argument("--server-log", default=None, help="file for the launched server's output")
    p.add_argument("--label", default=None, help="the server's name in the results (default: from how it runs)")
    p.add_argument("--num-requests", default=None, help="requests per level: one number, or one per level, "
                   "comma-separated (default: max(32, 4 x concurrency))")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths from [x (1 - r), x (1 + r)] (vLLM's)")
    return p.parse_args(argv)


def per_level(levels: list[int], spec: str, flag: str) -> list[float]:
    """One value for every level, or one per level, comma-separated."""
    values = [float(x) for x in spec.split(",")]
    if len(values) not in (1, len(levels)):
        raise ValueError(f"{flag} has {len(values)} numbers for {len(levels)} levels")
    return values * len(levels) if len(values) == 1 else values


def completion_spec(base_url: str, model: str, prompt: object, args: argparse.Namespace, tokens: int) -> RequestSpec:
    """A streamed /v1/completions request of `tokens` tokens with ignore_eos, its usage in the last chunk."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": args.temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    return RequestSpec(base_url.rstrip("/") + "/v1/completions", body, tokens)


Conversations = list[list[RequestSpec]]  # each conversation's turns, in order; a request is one turn


async def run_levels(args: argparse.Namespace, base_url: str, warm: list[RequestSpec],
                     level: Callable[[int, int], Conversations], on_level: Callable[[list[dict[str, object]]], None]
                     ) -> list[dict[str, object]]:
    """The warm-up requests, then every level of `--levels` in order, `level(index, concurrency)` giving its
    conversations; `on_level` gets the levels done so far after each one."""
    levels = [int(x) for x in args.levels.split(",")]
    results: list[dict[str, object]] = []
    async with new_session(max(levels), args.read_timeout) as session:
        if warm:
            done, _ = await run_conversations(session, [[spec] for spec in warm], 8)
            print(f"warm-up: {sum(r.is_ok for (r,) in done)}/{len(done)} ok", flush=True)
        for index, concurrency in enumerate(levels):
            planned = level(index, concurrency)
            before, cpu_start = read_counters(base_url), time.process_time()
            deadline = None if args.max_seconds_per_level is None else time.perf_counter() + args.max_seconds_per_level
            done, duration = await run_conversations(session, planned, concurrency, deadline)
            results.append({**level_figures(concurrency, planned, done, duration),
                            "client_cpu_share": round((time.process_time() - cpu_start) / duration, 3),
                            **counter_figures(before, read_counters(base_url), duration)})
            print(format_level(results[-1]), flush=True)
            on_level(results)
    return results


def level_figures(concurrency: int, planned: Conversations, done: list[list[RequestRecord]], duration_s: float
                  ) -> dict[str, object]:
    """bench/stats.py's figures of a level's requests; where conversations have several turns, TTFT of first and of
    later turns apart."""
    records = [r for turns in done for r in turns]
    figures = {**summarize(concurrency, records, duration_s), "num_conversations": len(done),
               "num_conversations_planned": len(planned), "errors": sorted({r.error for r in records if r.error})[:5]}
    if any(len(turns) > 1 for turns in planned):
        figures |= {"ttft_ms_first_turn": ms_percentiles([turns[0].ttft for turns in done if turns[0].is_ok]),
                    "ttft_ms_later_turns": ms_percentiles([r.ttft for turns in done for r in turns[1:] if r.is_ok])}
    return figures


def format_level(lv: dict) -> str:
    ttft, tpot, itl, rate = lv["ttft_ms"], lv["tpot_ms"], lv["itl_ms"], lv["prefix_hit_rate"]
    return (f"c={lv['concurrency']:<4} n={lv['num_requests']:<5} failed={lv['num_failed']:<3} "
            f"{lv['output_tokens_per_s']:>9.1f} tok/s  TTFT p50/p99 {ttft['p50']:.1f}/{ttft['p99']:.1f} ms  "
            f"TPOT {tpot['p50']:.2f}/{tpot['p99']:.2f} ms  ITL p50/p99/max {itl['p50']:.2f}/{itl['p99']:.2f}/"
            f"{itl['max']:.0f} ms  E2E p50 {lv['e2e_ms']['p50']:.0f} ms  hit rate {'-' if rate is None else rate}")


# The server's counters

COUNTERS = ("prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total")


def parse_counters(exposition: str) -> dict[str, float]:
    """COUNTERS from a Prometheus text exposition, summed over label sets; a name matches with any namespace
    (`openai_serve:`, vLLM's `vllm:`). Counters the server does not export are absent."""
    found: dict[str, float] = {}
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        key = line.split("{", 1)[0].split(" ", 1)[0].rsplit(":", 1)[-1]
        if key in COUNTERS:
            found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def read_counters(base_url: str) -> dict[str, float]:
    """/metrics' counters, empty when the server has no /metrics."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
            return parse_counters(response.read().decode())
    except OSError:
        return {}


def counter_figures(before: dict[str, float], after: dict[str, float], duration_s: float) -> dict[str, object]:
    """The level's prefix-cache hit rate (in tokens), its prompt tokens (all of them: `prompt_tokens_total` counts
    cached ones too) and those the engine computed (queried less hit), from two readings of the counters."""
    delta = {k: after[k] - before[k] for k in COUNTERS if k in before and k in after}
    queries, hits = delta.get("prefix_cache_queries_total"), delta.get("prefix_cache_hits_total")
    prompt = delta.get("prompt_tokens_total")
    return {"prefix_cache_queried_tokens": queries, "prefix_cache_hit_tokens": hits, "prompt_tokens": prompt,
            "prefix_hit_rate": round(hits / queries, 4) if queries and hits is not None else None,
            "prompt_tokens_per_s": round(prompt / duration_s, 1) if prompt is not None else None,
            "computed_prompt_tokens": queries - hits if queries is not None and hits is not None else None}


# The server under test.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openai_serve_command(server_args: str, port: int) -> list[str]:
    return [sys.executable, "-m", "openai_serve", *shlex.split(server_args), "--host", "127.0.0.1", "--port", str(port)]


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
        time.sleep(0.1)  # a fine poll: the seconds to /health are what bench.startup_time reports
    raise RuntimeError(f"/health did not answer 200 within {timeout_s:.0f} s")


def first_model(base_url: str) -> str:
    with urllib.request.urlopen(base_url + "/v1/models", timeout=30) as response:
        return str(json.loads(response.read())["data"][0]["id"])


@contextmanager
def launched(command: list[str], port: int, log_path: str | None, health_timeout_s: float
             ) -> Iterator[tuple[str, dict[str, object]]]:
    """A server started with `command` on `port`, ready when GET /health answers 200: (its base URL, how it was
    started). Stopped on the way out; SIGTERM (a `timeout` around the run) unwinds through here."""
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(os.path.dirname(os.path.abspath(log_path or os.devnull)), exist_ok=True)  # its folder may be new
    with open(log_path or os.devnull, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}"
            startup_s = wait_for_health(base_url, process, health_timeout_s)
            yield base_url, {"command": shlex.join(command), "startup_s": round(startup_s, 1)}
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            signal.signal(signal.SIGTERM, previous_handler)  # as it was, for callers that run main() in-process


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    label = args.label or ("openai-serve" if args.launch else args.base_url)
    if args.base_url:
        startup_s = round(wait_for_health(args.base_url.rstrip("/"), None, args.health_timeout), 1)
        run(args, argv, args.base_url.rstrip("/"), {"label": label, "startup_s": startup_s})
        return
    port = free_port()
    command = openai_serve_command(args.server_args, port)
    with launched(command, port, args.server_log, args.health_timeout) as (url, info):
        run(args, argv, url, {"label": label, **info})


def run(args: argparse.Namespace, argv: list[str], base_url: str, server: dict[str, object]) -> None:
    """Every level against one server, each drawing its own prompts (seed + level: a level repeated gets new ones);
    the result file is rewritten after each level, so a run cut short keeps the levels it finished."""
    server["model"] = model = args.model or first_model(base_url)
    levels = [int(x) for x in args.levels.split(",")]
    counts = per_level(levels, args.num_requests, "--num-requests") if args.num_requests else [
        max(32, 4 * c) for c in levels]

    def specs(num: int, seed: int) -> list[RequestSpec]:
        return [completion_spec(base_url, model, r.prompt_token_ids, args, r.max_tokens)
                for r in fixed_workload(num, args.prompt_len, args.max_tokens, seed, args.range_ratio)]

    def level(index: int, concurrency: int) -> Conversations:
        return [[spec] for spec in specs(int(counts[index]), args.seed + 1000 * index + concurrency)]

    config = {k: getattr(args, k) for k in ("prompt_len", "max_tokens", "range_ratio", "temperature", "seed",
                                            "warmup_requests", "max_seconds_per_level")}

    def save(levels: list[dict[str, object]], is_complete: bool) -> None:
        write_result(args.out, {"kind": "serve", "server": server, "config": config, "levels": levels,
                                "is_complete": is_complete}, "bench.serve", argv)

    save(run_async(run_levels(args, base_url, specs(args.warmup_requests, args.seed + 10**6), level,
                              partial(save, is_complete=False))), is_complete=True)


def run_async(levels: Coroutine[object, object, list[dict[str, object]]]) -> list[dict[str, object]]:
    """On uvloop where it is installed: a lighter client loop."""
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(levels)


if __name__ == "__main__":
    main()
