"""Big bodies, and the heaviest legal requests, against a server in its own process (probe_server.py),
whose event loop and memory are measured from inside: each case's worst event-loop stall while the
server answers it, and the growth of the server's resident memory over all of them. Before bodies were
bounded the first case held every client for over 120 s and left the server 3.8 GiB larger; before the
server froze its start-up heap (server.py) the streamed n=64 case stalled the loop 166-293 ms in
Python's full garbage collections.

Bounds asserted here leave room for a CI machine busy with other work (this suite's figures, with
the machine they were taken on, are in docs/reliability.md); what they catch is the seconds of
stall and the gigabytes of growth that came back if any of this work returned to the event loop.
"""

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.alone  # it measures the event loop's stalls

CONTEXT = 2048
STALL_GOAL_MS = 50.0  # the goal, recorded beside what was measured
MAX_STALL_MS = 150.0  # asserted: the goal with room for a busy CI machine
MAX_RSS_GROWTH_MIB = 300.0
WORDS = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex "


@dataclass(frozen=True)
class BigCase:
    name: str
    path: str
    body: object
    status: int


def cases() -> list[BigCase]:
    """The issue's cases, and the largest bodies under the limit (1 MiB for this context) of each kind."""
    chat = {"model": "tiny", "max_tokens": 4}
    return [
        BigCase("28.6 MB prompt", "/v1/completions", {"model": "tiny", "prompt": "a" * 28_600_000}, 413),
        BigCase("10 MB /tokenize", "/tokenize", {"prompt": WORDS * 133_000}, 413),
        BigCase("200k one-character messages", "/v1/chat/completions",
                chat | {"messages": [{"role": "user", "content": "x"}] * 200_000}, 413),
        BigCase("100k stop strings", "/v1/completions",
                {"model": "tiny", "prompt": "hi", "stop": [f"s{i}" for i in range(100_000)]}, 400),
        BigCase("1 MB prompt", "/v1/completions", {"model": "tiny", "prompt": WORDS * 13_500}, 400),
        BigCase("1 MB /tokenize", "/tokenize", {"prompt": WORDS * 13_500}, 400),
        BigCase("340k token ids", "/v1/completions", {"model": "tiny", "prompt": [7] * 340_000}, 400),
        BigCase("30k one-character messages", "/v1/chat/completions",
                chat | {"messages": [{"role": "user", "content": "x"}] * 30_000}, 400),
        BigCase("256 prompts of 80 tokens", "/v1/completions",
                {"model": "tiny", "prompt": [WORDS * 25] * 256, "max_tokens": 1}, 200),
        BigCase("40 prompts of 25k characters", "/v1/completions",
                {"model": "tiny", "prompt": [WORDS * 330] * 40, "max_tokens": 1}, 400),
        BigCase("2000 messages", "/v1/chat/completions",
                chat | {"messages": [{"role": "user", "content": "hello there"}] * 2000}, 400),
        BigCase("300 tools (which the tiny model's template leaves out)", "/v1/chat/completions", chat | {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": f"tool_{i}", "description": WORDS * 10,
                                                        "parameters": {"type": "object"}}} for i in range(300)]}, 200),
        BigCase("a prompt of 1900 tokens, answered", "/v1/completions",
                {"model": "tiny", "prompt": list(range(3, 503)) * 3 + [5] * 400, "max_tokens": 16}, 200),
        BigCase("64 streamed choices of 128 tokens, 20 logprobs each", "/v1/chat/completions", chat | {
            "messages": [{"role": "user", "content": "hi"}], "n": 64, "max_tokens": 128, "ignore_eos": True,
            "stream": True, "logprobs": True, "top_logprobs": 20}, 200),
        BigCase("a 24k-character prompt, tokenized", "/tokenize", {"prompt": WORDS * 320}, 200),
        BigCase("detokenize a context of ids", "/detokenize", {"tokens": list(range(3, 503)) * 4}, 200),
    ]


@pytest.fixture(scope="module")
def probe_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    port_file = tmp_path_factory.mktemp("probe") / "port"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    process = subprocess.Popen([sys.executable, "-m", "tests.reliability.probe_server", str(model_dir), str(port_file),
                                str(CONTEXT)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, "the probe server did not start"
            time.sleep(0.1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port_file.read_text()}", timeout=120) as http:
            while True:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, "the probe server did not start"
                time.sleep(0.1)
            yield http
    finally:
        process.terminate()
        process.wait(timeout=30)


def health_latencies(http: httpx.Client, stop: threading.Event, out: list[float]) -> None:
    """What another client sees meanwhile: how long /health takes."""
    with httpx.Client(base_url=http.base_url, timeout=120) as other:
        while not stop.is_set():
            started = time.monotonic()
            other.get("/health")
            out.append(time.monotonic() - started)
            time.sleep(0.01)


def test_big_bodies_neither_stall_the_event_loop_nor_grow_memory(probe_server: httpx.Client,
                                                                   figures: dict[str, object]) -> None:
    http = probe_server
    http.post("/v1/completions", json={"model": "tiny", "prompt": "warm up", "max_tokens": 4})
    rss_before = http.get("/_probe").json()["rss_mib"]
    results = {}
    for case in cases():
        content = json.dumps(case.body).encode()
        http.post("/_probe/reset")
        time.sleep(0.05)
        stop, latencies = threading.Event(), []
        poller = threading.Thread(target=health_latencies, args=(http, stop, latencies), daemon=True)
        poller.start()
        started = time.monotonic()
        response = http.post(case.path, content=content, headers={"content-type": "application/json"})
        took = time.monotonic() - started
        stop.set()
        poller.join()
        probe = http.get("/_probe").json()
        assert response.status_code == case.status, (case.name, response.text[:300])
        results[case.name] = {"mb": round(len(content) / 1e6, 1), "status": response.status_code,
                              "answered_in_s": round(took, 3), "worst_stall_ms": round(probe["worst_stall_ms"], 1),
                              "worst_health_ms": round(1e3 * max(latencies, default=0), 1)}
    rss_after = http.get("/_probe").json()
    stalls = {name: r["worst_stall_ms"] for name, r in results.items()}
    figures["big_bodies"] = {"cases": results, "worst_stall_ms": max(stalls.values()), "stall_goal_ms": STALL_GOAL_MS,
                             "rss_before_mib": round(rss_before, 1),
                             "rss_after_mib": round(rss_after["rss_mib"], 1),
                             "peak_rss_mib": round(rss_after["peak_rss_mib"], 1)}
    print(json.dumps(figures["big_bodies"], indent=1))
    assert max(stalls.values()) < MAX_STALL_MS, stalls
    assert rss_after["rss_mib"] - rss_before < MAX_RSS_GROWTH_MIB, (rss_before, rss_after)
