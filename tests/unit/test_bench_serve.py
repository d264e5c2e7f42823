"""The load generator: SSE parsing, metrics from a scripted stub server, and a run against the real server.

The stub (test-only, Starlette on uvicorn in a thread) streams exactly the bytes a test wants with
known delays, so what the client must measure is known; its `model` field picks a behaviour.
"""

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench import serve
from bench.bench_model import build_small_bench_model
from bench.load import SSEParser

FIRST_TOKEN_DELAY_S = 0.05
TOKEN_DELAY_S = 0.01


# SSEParser


def test_parser_yields_complete_events_only() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\ndata: {"b"') == ['{"a": 1}']
    assert parser.feed(b": 2}\n") == []  # still no blank line
    assert parser.feed(b"\n") == ['{"b": 2}']


def test_parser_handles_any_split_crlf_comments_and_multiline_data() -> None:
    stream = b": ping\r\n\r\ndata: one\r\n\r\nevent: x\ndata: two\ndata:three\n\ndata: [DONE]\r\n\r\n"
    expected = ["one", "two\nthree", "[DONE]"]
    for size in (1, 2, 3, 5, 7, len(stream)):
        parser = SSEParser()
        events = [e for i in range(0, len(stream), size) for e in parser.feed(stream[i : i + size])]
        assert events == expected, size


# A scripted stub server


def _chunk(text: str | None, usage: dict[str, int] | None = None, finish: str | None = None) -> bytes:
    choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": finish}]
    return b"data: " + json.dumps({"choices": choices, "usage": usage}).encode() + b"\n\n"


class Stub:
    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", lambda _: JSONResponse({"data": [{"id": "good"}]})),
            Route("/health", lambda _: JSONResponse({"status": "ok"})),
        ])

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        if body["model"] == "http-error":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        return StreamingResponse(self.stream(body), media_type="text/event-stream")

    async def stream(self, body: dict[str, object]) -> AsyncIterator[bytes]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            n = int(body["max_tokens"])  # type: ignore[call-overload]
            if body["model"] == "short":
                n -= 1
            yield b": keep-alive comment\n\n"
            for i in range(n):
                await asyncio.sleep(FIRST_TOKEN_DELAY_S if i == 0 else TOKEN_DELAY_S)
                yield _chunk(f" w{i}")
                if body["model"] == "cut" and i == 1:
                    return
            yield _chunk("", finish="length")
            yield _chunk(None, usage={"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n})
            if body["model"] != "no-done":
                yield b"data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[Stub, str]]:
    app = Stub()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield app, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _run(url: str, tmp_path: Path, model: str, *extra: str) -> dict[str, object]:
    out = tmp_path / f"{model}.json"
    serve.main(["--base-url", url, "--model", model, "--prompt-len", "16", "--max-tokens", "5",
                "--warmup-requests", "0", "--out", str(out), *extra])
    return json.loads(out.read_text())


def test_metrics_of_a_good_stream(stub: tuple[Stub, str], tmp_path: Path) -> None:
    app, url = stub
    result = _run(url, tmp_path, "good", "--levels", "1,4", "--num-requests", "3,8")
    one, four = result["levels"]  # type: ignore[misc]
    assert (one["num_requests"], one["num_failed"], one["num_output_tokens"], one["num_without_done"]) == (3, 0, 15, 0)
    assert (four["num_requests"], four["num_failed"], four["num_output_tokens"]) == (8, 0, 40)
    # The stub waits 50 ms before the first token and 10 ms between tokens.
    assert FIRST_TOKEN_DELAY_S * 1e3 <= one["ttft_ms"]["p50"] < FIRST_TOKEN_DELAY_S * 1e3 + 40
    assert TOKEN_DELAY_S * 1e3 * 0.9 <= one["tpot_ms"]["p50"] < TOKEN_DELAY_S * 1e3 + 8
    assert TOKEN_DELAY_S * 1e3 * 0.9 <= one["itl_ms"]["p50"] < TOKEN_DELAY_S * 1e3 + 8
    assert app.max_in_flight == 4  # level 4 never exceeded, and reached, its concurrency
    assert result["device"] and result["date"] and result["commit"] and "bench.serve" in result["command"]
    assert result["is_complete"] is True
    assert one["server_cpu_share"] is None  # not launched here: its CPU time is unknown


def test_request_body_asks_for_token_ids_streamed_with_usage_and_ignore_eos(stub: tuple[Stub, str],
                                                                           tmp_path: Path) -> None:
    app, url = stub
    app.bodies.clear()
    _run(url, tmp_path, "good", "--levels", "2", "--num-requests", "2")
    prompts = [b["prompt"] for b in app.bodies]
    assert all(isinstance(p, list) and len(p) == 16 and all(0 <= t < 10_000 for t in p) for p in prompts)
    assert prompts[0] != prompts[1]
    body = app.bodies[0]
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 5
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("model", "error"), [
    ("cut", "without a finish_reason or data: [DONE]"), ("short", "4 tokens, 5 asked for"), ("http-error", "HTTP 500"),
])
def test_failures_are_counted_with_their_reason(stub: tuple[Stub, str], tmp_path: Path, model: str,
                                                error: str) -> None:
    _, url = stub
    level = _run(url, tmp_path, model, "--levels", "2", "--num-requests", "3")["levels"][0]  # type: ignore[index]
    assert level["num_requests"] == 3 and level["num_failed"] == 3
    assert level["output_tokens_per_s"] == 0.0
    assert any(error in e for e in level["errors"])


def test_a_finished_stream_without_done_is_complete_but_counted(stub: tuple[Stub, str], tmp_path: Path) -> None:
    _, url = stub
    level = _run(url, tmp_path, "no-done", "--levels", "2", "--num-requests", "3")["levels"][0]  # type: ignore[index]
    assert (level["num_failed"], level["num_output_tokens"], level["num_without_done"]) == (0, 15, 3)


def test_the_time_box_stops_starting_requests(stub: tuple[Stub, str], tmp_path: Path) -> None:
    _, url = stub
    level = _run(url, tmp_path, "good", "--levels", "1", "--num-requests", "50",
                 "--max-seconds-per-level", "0.2")["levels"][0]  # type: ignore[index]
    assert 1 <= level["num_requests"] < 10 and level["num_failed"] == 0 and level["num_requests_planned"] == 50


# The real server


def test_against_openai_serve_launched_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("openai_serve.cli")
    model = build_small_bench_model(tmp_path / "model")
    out = tmp_path / "serve.json"
    serve.main(["--launch", "--server-args", f"--model {model} --device cpu --max-model-len 256 --kv-cache-blocks 128",
                "--levels", "1,4", "--num-requests", "2,6", "--prompt-len", "32", "--max-tokens", "6",
                "--warmup-requests", "1", "--server-log", str(tmp_path / "server.log"), "--out", str(out)])
    result = json.loads(out.read_text())
    one, four = result["levels"]
    assert (one["num_failed"], one["num_output_tokens"]) == (0, 2 * 6)
    assert (four["num_failed"], four["num_output_tokens"]) == (0, 6 * 6)
    assert 0 < one["ttft_ms"]["p50"] < one["e2e_ms"]["p50"]
    assert one["server_cpu_share"] > 0  # the launched server's own CPU time is measured
    assert result["server"]["label"] == "openai-serve" and result["server"]["model"] == str(model)
    with pytest.raises(OSError):  # the launched server was stopped
        socket.create_connection(("127.0.0.1", int(result["server"]["command"].rsplit(" ", 1)[1])), timeout=1)
