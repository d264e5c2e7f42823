"""The load generator: SSE parsing, metrics from a scripted stub server (in a thread, and launched, timed and
stopped as bench.serve launches a server), and a run against the real server.
"""

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import serve
from bench.load import SSEParser
from tests.bench import stub_server
from tests.bench.stub_server import FIRST_TOKEN_DELAY_S, TOKEN_DELAY_S, Stub, running_stub
from tests.e2e.serving import start_server

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


# Against the scripted stub server (tests/bench/stub_server.py), in a thread


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[Stub, str]]:
    with running_stub() as running:
        yield running


def _run(url: str, tmp_path: Path, model: str, *extra: str) -> dict[str, object]:
    out = tmp_path / f"{model}.json"
    serve.main(["--base-url", url, "--model", model, "--prompt-len", "16", "--max-tokens", "5",
                "--warmup-requests", "0", "--out", str(out), *extra])
    return json.loads(out.read_text())


def test_metrics_of_a_good_stream(stub: tuple[Stub, str], tmp_path: Path) -> None:
    app, url = stub
    result = _run(url, tmp_path, "good", "--levels", "1,4", "--num-requests", "3,8")
    one, four = result["levels"]  # type: ignore[misc]
    assert (one["num_requests"], one["num_failed"], one["num_output_tokens"]) == (3, 0, 15)
    assert (four["num_requests"], four["num_failed"], four["num_output_tokens"]) == (8, 0, 40)
    # The stub waits 50 ms before the first token and 10 ms between tokens.
    assert FIRST_TOKEN_DELAY_S * 1e3 <= one["ttft_ms"]["p50"] < FIRST_TOKEN_DELAY_S * 1e3 + 40
    assert TOKEN_DELAY_S * 1e3 * 0.9 <= one["tpot_ms"]["p50"] < TOKEN_DELAY_S * 1e3 + 8
    assert TOKEN_DELAY_S * 1e3 * 0.9 <= one["itl_ms"]["p50"] < TOKEN_DELAY_S * 1e3 + 8
    assert app.max_in_flight == 4  # level 4 never exceeded, and reached, its concurrency
    assert result["device"] and result["date"] and result["commit"] and "bench.serve" in result["command"]
    assert result["is_complete"] is True


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


def test_a_finished_stream_without_done_is_complete(stub: tuple[Stub, str], tmp_path: Path) -> None:
    _, url = stub
    level = _run(url, tmp_path, "no-done", "--levels", "2", "--num-requests", "3")["levels"][0]  # type: ignore[index]
    assert (level["num_failed"], level["num_output_tokens"]) == (0, 15)


def test_the_time_box_stops_starting_requests(stub: tuple[Stub, str], tmp_path: Path) -> None:
    _, url = stub
    level = _run(url, tmp_path, "good", "--levels", "1", "--num-requests", "50",
                 "--max-seconds-per-level", "0.2")["levels"][0]  # type: ignore[index]
    assert 1 <= level["num_requests"] < 10 and level["num_failed"] == 0 and level["num_conversations_planned"] == 50


# A launched server, and the real one


def test_a_launched_server_is_waited_for_timed_and_stopped(tmp_path: Path) -> None:
    port = serve.free_port()
    command = [sys.executable, str(stub_server.__file__), str(port)]
    with serve.launched(command, port, str(tmp_path / "server.log"), 60) as (url, server):
        assert serve.first_model(url) == "good"
        assert server["startup_s"] >= 0 and server["command"].endswith(f" {port}")
    assert (tmp_path / "server.log").exists()
    with pytest.raises(OSError):  # the launched server was stopped
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_against_openai_serve(tmp_path: Path, tiny_bench_model: Path) -> None:
    """The real server (in a thread of this process: tests/e2e/serving.py) on a tiny model whose vocabulary covers
    the workload's prompt ids; its streams are counted as the OpenAI SDK would read them."""
    server = start_server(tiny_bench_model, max_model_len=256, num_blocks=128)
    try:
        out = tmp_path / "serve.json"
        serve.main(["--base-url", server.base_url, "--label", "openai-serve", "--levels", "1,4",
                    "--num-requests", "2,6", "--prompt-len", "32", "--max-tokens", "6", "--warmup-requests", "1",
                    "--out", str(out)])
    finally:
        server.stop()
    result = json.loads(out.read_text())
    one, four = result["levels"]
    assert (one["num_failed"], one["num_output_tokens"]) == (0, 2 * 6)
    assert (four["num_failed"], four["num_output_tokens"]) == (0, 6 * 6)
    assert 0 < one["ttft_ms"]["p50"] < one["e2e_ms"]["p50"]
    # The server's counters over the level: distinct prompts, so nothing hits the prefix cache.
    assert (four["prompt_tokens"], four["prefix_cache_hit_tokens"], four["prefix_hit_rate"]) == (6 * 32, 0, 0.0)
    assert "ttft_ms_first_turn" not in four  # one turn per conversation: no later turns to set apart
    assert result["server"]["label"] == "openai-serve" and result["server"]["model"] == "tiny"
