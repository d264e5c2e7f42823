"""The balancer of docker-compose.yml, for real: Debian's HAProxy running configs/haproxy/haproxy.cfg
(only its listening port and replica addresses swapped for localhost ones) in front of two
`openai-serve` processes. A stream through it equals one straight from a replica and arrives as it
is made; a conversation's header keeps it on one replica; a replica killed mid-run costs the
stream it was serving, and the next requests still succeed.
"""

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.serving import parse_metrics
from tests.e2e.sse_client import DONE, iter_events
from tests.e2e.test_cli import ROOT, free_port, wait_healthy
from tests.required_tools import require_tool

HAPROXY = "/usr/sbin/haproxy"
CONFIG = ROOT / "configs" / "haproxy" / "haproxy.cfg"
MODEL = "tiny"


@dataclass
class Replica:
    name: str
    process: subprocess.Popen
    base_url: str


@dataclass
class Cluster:
    replicas: dict[str, Replica]
    balancer: subprocess.Popen
    base_url: str


def localhost_config(listen_port: int, replicas: dict[str, int]) -> str:
    """The compose file's HAProxy config, listening on `listen_port`, with these replicas."""
    text = CONFIG.read_text()
    text, binds = re.subn(r"^\s*bind .*# balancer-bind$", f"    bind 127.0.0.1:{listen_port}", text, flags=re.M)
    servers = "\n".join(f"    server {name} 127.0.0.1:{port}" for name, port in replicas.items())
    text, templates = re.subn(r"^\s*server-template .*# balancer-replicas$", servers, text, flags=re.M)
    assert binds == 1 and templates == 1, "the markers this test swaps are gone from haproxy.cfg"
    return text


def start_replica(name: str, model_dir: Path, log_dir: Path) -> Replica:
    port = free_port()
    # One process each (the engine as a thread): the same HTTP behaviour, and a faster start.
    args = [sys.executable, "-m", "openai_serve", "--model", str(model_dir), "--served-model-name", MODEL,
            "--port", str(port), "--device", "cpu", "--max-model-len", "512", "--kv-cache-blocks", "256",
            "--no-engine-process", "--log-level", "warning"]
    with open(log_dir / f"{name}.log", "w") as log:  # a file, not a pipe nobody reads (which could fill up)
        process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return Replica(name, process, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_tool(HAPROXY, "haproxy")
    work_dir = tmp_path_factory.mktemp("balancer")
    replicas = {name: start_replica(name, model_dir, work_dir) for name in ("replica1", "replica2")}  # at once
    balancer = None
    try:
        for replica in replicas.values():
            wait_healthy(replica.base_url, replica.process)
        port = free_port()
        config = work_dir / "haproxy.cfg"
        config.write_text(localhost_config(port, {n: int(r.base_url.rsplit(":", 1)[1]) for n, r in replicas.items()}))
        with open(work_dir / "haproxy.log", "w") as log:
            balancer = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
        wait_healthy(f"http://127.0.0.1:{port}", balancer, timeout=20)
        yield Cluster(replicas, balancer, f"http://127.0.0.1:{port}")
    finally:
        for process in [r.process for r in replicas.values()] + [balancer]:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def chat_body(question: str, max_tokens: int = 40) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}


@dataclass
class Streamed:
    served_by: str | None
    text: str
    finish_reason: str | None
    arrival_times: list[float]  # of each event, time.monotonic()


def stream_chat(base_url: str, body: dict, session: str | None = None) -> Streamed:
    headers = {"X-Session-Id": session} if session else {}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        text, finish_reason, times = "", None, []
        for event in iter_events(response.iter_lines()):
            times.append(time.monotonic())
            if event == DONE:
                break
            choice = json.loads(event)["choices"][0]
            text += choice["delta"].get("content") or ""
            finish_reason = choice["finish_reason"] or finish_reason
        return Streamed(response.headers.get("x-served-by"), text, finish_reason, times)


def test_a_stream_through_the_balancer_equals_one_from_a_replica(cluster: Cluster) -> None:
    body = chat_body("Tell me about paged attention.", max_tokens=120)
    direct = stream_chat(cluster.replicas["replica1"].base_url, body)
    balanced = stream_chat(cluster.base_url, body)
    assert balanced.served_by in cluster.replicas
    assert (balanced.text, balanced.finish_reason) == (direct.text, direct.finish_reason)
    assert direct.text and balanced.finish_reason == "length"


def test_events_pass_the_balancer_as_they_are_made(cluster: Cluster) -> None:
    with httpx.stream("POST", cluster.base_url + "/v1/chat/completions", json=chat_body("Go", 400),
                      timeout=60) as response:
        replica = cluster.replicas[response.headers["x-served-by"]]
        events = iter_events(response.iter_lines())
        next(events)
        next(events)  # a content chunk has come through while the replica still generates:
        assert parse_metrics(httpx.get(replica.base_url + "/metrics").text)["num_requests_running"] == 1
        assert list(events)[-1] == DONE


def test_a_conversation_stays_on_one_replica(cluster: Cluster) -> None:
    body = chat_body("Hi", max_tokens=2)
    served = {session: {stream_chat(cluster.base_url, body, session).served_by for _ in range(3)}
              for session in [f"conversation-{i}" for i in range(8)]}
    assert all(len(replicas) == 1 for replicas in served.values()), served
    assert set().union(*served.values()) == set(cluster.replicas)  # and the conversations spread over both


def test_a_replica_killed_mid_run_and_the_next_requests_still_succeed(cluster: Cluster) -> None:
    session = next(f"s{i}" for i in range(100)
                   if stream_chat(cluster.base_url, chat_body("Hi", 1), f"s{i}").served_by == "replica1")
    victim = cluster.replicas["replica1"]
    with httpx.stream("POST", cluster.base_url + "/v1/chat/completions", json=chat_body("Go on", 400),
                      headers={"X-Session-Id": session}, timeout=60) as response:
        assert response.headers["x-served-by"] == "replica1"
        events = iter_events(response.iter_lines())
        next(events)
        victim.process.send_signal(signal.SIGKILL)  # dies mid-stream, without a word
        victim.process.wait()
        with pytest.raises(httpx.HTTPError):
            list(events)  # this stream is lost with its replica
    # At once, before any health check has noticed: the same conversation goes to the other replica.
    for _ in range(5):
        answer = stream_chat(cluster.base_url, chat_body("Are you there?", 5), session)
        assert answer.served_by == "replica2" and answer.finish_reason == "length"
    plain = httpx.post(cluster.base_url + "/v1/chat/completions", json={**chat_body("Hi", 3), "stream": False})
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 3
