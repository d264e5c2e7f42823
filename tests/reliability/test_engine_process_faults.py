"""The engine in its own process (the default) under disconnect chaos and a SIGKILL.

- Hundreds of clients close at random moments (mid-body, right after sending, mid-stream; half of
  them with a TCP reset): afterwards no request runs and every KV block is free.
- The engine process is killed with 20 streams and 5 non-streamed requests running: each gets its
  terminal event (an error event and [DONE], or a 503) within 2 s, the server restarts its engine,
  and serves again.
- With --exit-on-engine-failure the server exits with status 1 instead.
"""

import json
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, server_config, start_server
from tests.e2e.sse_client import DONE, iter_events

NUM_CHAOS_CLIENTS = 300
NUM_STREAMS, NUM_IN_FULL = 20, 5
LONG = 1900  # tokens: no request ends by itself before the kill


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, engine_process=True, max_model_len=2048, num_blocks=4096)
    yield running
    running.stop()


def port_of(running: RunningServer) -> int:
    return int(running.base_url.rsplit(":", 1)[1])


def request_bytes(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        path, body = "/v1/completions", {"prompt": "Once upon a time"}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}]}
    body |= {"model": MODEL, "max_tokens": rng.randint(1, 64), "ignore_eos": True, "n": rng.choice([1, 1, 2]),
             "stream": rng.random() < 0.6}
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()
    return head + data


def chaos_client(port: int, seed: int) -> None:
    """One client that leaves at a random moment."""
    rng = random.Random(seed)
    data = request_bytes(rng)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if rng.random() < 0.5:  # a reset rather than an orderly close
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        moment = rng.choice(["mid-body", "after-sending", "mid-answer", "mid-answer"])
        if moment == "mid-body":
            sock.sendall(data[: rng.randint(1, len(data) - 1)])
            time.sleep(rng.uniform(0, 0.02))
            return
        sock.sendall(data)
        if moment == "after-sending":
            time.sleep(rng.uniform(0, 0.05))
            return
        wanted, received = rng.randint(1, 3000), 0
        while received < wanted:
            chunk = sock.recv(4096)
            if not chunk:
                return
            received += len(chunk)


def test_random_disconnects_leave_no_request_running_and_every_block_free(
    server: RunningServer, figures: dict[str, object]
) -> None:
    port = port_of(server)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda seed: chaos_client(port, seed), range(NUM_CHAOS_CLIENTS)))
    metrics = server.wait_idle(timeout=30)
    assert metrics["num_requests_in_flight"] == 0 and metrics["num_requests_running"] == 0
    assert metrics["num_kv_blocks_used"] == 0
    assert metrics["num_kv_blocks_free"] + metrics["num_kv_blocks_evictable"] == metrics["num_kv_blocks"]
    with server.http() as http:
        assert http.get("/health").json() == {"status": "ok", "engine_restarts": 0}
    figures["disconnect_chaos"] = {"clients": NUM_CHAOS_CLIENTS, "kv_blocks_used_after": metrics["num_kv_blocks_used"]}


class Client(threading.Thread):
    """A request that runs until the kill: `ended_at` is when its terminal event arrived, `ending` what it was."""

    def __init__(self, base_url: str, stream: bool, started: threading.Semaphore) -> None:
        super().__init__(daemon=True)
        self.base_url, self.stream, self.started = base_url, stream, started
        self.ended_at: float | None = None
        self.ending: object = None

    def run(self) -> None:
        body = {"model": MODEL, "prompt": "Once", "max_tokens": LONG, "ignore_eos": True, "stream": self.stream}
        with httpx.Client(base_url=self.base_url, timeout=60) as http:
            if not self.stream:
                self.started.release()
                response = http.post("/v1/completions", json=body)
                self.ended_at, self.ending = time.monotonic(), response
                return
            with http.stream("POST", "/v1/completions", json=body) as response:
                events = iter_events(response.iter_lines())
                next(events)
                self.started.release()
                rest = list(events)
            self.ended_at, self.ending = time.monotonic(), rest[-2:]


@pytest.mark.alone  # it times how soon streams end
def test_a_killed_engine_ends_every_request_within_2_s_and_is_restarted(
    server: RunningServer, figures: dict[str, object]
) -> None:
    started = threading.Semaphore(0)
    clients = [Client(server.base_url, i < NUM_STREAMS, started) for i in range(NUM_STREAMS + NUM_IN_FULL)]
    for client in clients:
        client.start()
    for _ in clients:
        assert started.acquire(timeout=60)
    deadline = time.monotonic() + 30
    while server.metrics()["num_requests_in_flight"] < NUM_STREAMS + NUM_IN_FULL:  # the last ones are in the engine
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.engine._process.kill()  # type: ignore[attr-defined]  # as the OOM killer, or a lost device, would
    killed_at = time.monotonic()
    for client in clients:
        client.join(timeout=10)
        assert client.ended_at is not None, "a request got no terminal event"
    delays = [client.ended_at - killed_at for client in clients]  # type: ignore[operator]
    for client in clients[:NUM_STREAMS]:
        assert client.ending[-1] == DONE and '"engine_failed"' in client.ending[0]  # type: ignore[index]
    for client in clients[NUM_STREAMS:]:
        assert assert_error_shape(client.ending, 503)["code"] == "engine_failed"  # type: ignore[arg-type]
    assert max(delays) < 2.0, delays
    restarted_in = wait_until_serving(server)
    with server.http() as http:
        answer = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
        assert http.get("/health").json() == {"status": "ok", "engine_restarts": 1}
    assert server.wait_idle()["num_kv_blocks_used"] == 0
    figures["engine_kill"] = {"requests": len(clients), "worst_terminal_event_s": round(max(delays), 3),
                              "restarted_in_s": round(restarted_in, 1)}


def wait_until_serving(server: RunningServer, timeout: float = 90) -> float:
    """Seconds until /health says the engine serves again (503 engine_restarting meanwhile)."""
    started = time.monotonic()
    with server.http() as http:
        while (health := http.get("/health")).status_code != 200:
            assert assert_error_shape(health, 503)["code"] == "engine_restarting"
            assert time.monotonic() - started < timeout, "the engine was not restarted"
            time.sleep(0.1)
    return time.monotonic() - started


def test_exit_on_engine_failure_ends_the_server_with_status_1(model_dir: Path) -> None:
    running = start_server(model_dir, server_config(exit_on_engine_failure=True), engine_process=True)
    with running.http() as http:
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}).status_code == 200
    running.engine._process.kill()  # type: ignore[attr-defined]
    running.thread.join(timeout=30)
    assert not running.thread.is_alive() and running.server.exit_code == 1
