"""Logs: one line per request (id, route, status, tokens, TTFT, total time, finish reason), the
X-Request-Id taken from the client or made and always returned, the reason of a 4xx, and the
periodic stats line while the engine works (quiet when idle)."""

import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.serving import MODEL, RunningServer, server_config, start_server

KEY = "sk-log-test"


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, server_config(api_key=KEY, stats_log_interval_s=0.2))
    yield running
    running.stop()


def request_lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "openai_serve.requests" and r.getMessage().startswith(request_id + " ")]


def wait_for_line(caplog: pytest.LogCaptureFixture, request_id: str) -> str:
    """The line is logged once the response has ended, which is just after the client has read it."""
    deadline = time.monotonic() + 5
    while not (lines := request_lines(caplog, request_id)):
        assert time.monotonic() < deadline, f"no log line for {request_id}"
        time.sleep(0.01)
    assert len(lines) == 1, lines
    return lines[0]


def test_a_streamed_chat_is_one_line_with_its_figures(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="openai_serve.requests")
    with server.http() as http:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7,
                "stream": True, "ignore_eos": True}
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": "client-id-42"}) as r:
            assert r.headers["x-request-id"] == "client-id-42"
            r.read()
    line = wait_for_line(caplog, "client-id-42")
    match = re.fullmatch(r"client-id-42 POST /v1/chat/completions 200 id=chatcmpl-\w+ prompt_tokens=(\d+) "
                         r"completion_tokens=7 cached_tokens=(\d+) ttft=(\d+\.\d+)s total=(\d+\.\d+)s "
                         r"finish_reason=length", line)
    assert match, line
    assert int(match[1]) > 0 and float(match[3]) <= float(match[4])


def test_a_message_of_anthropics_api_is_logged_as_chats_are(server: RunningServer,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="openai_serve.requests")
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    with server.http() as http:
        message = http.post("/v1/messages", json=body, headers={"X-Request-Id": "a-message"}).json()
        bad = http.post("/v1/messages", json=body | {"max_tokens": 0}, headers={"X-Request-Id": "bad-message"})
    line = wait_for_line(caplog, "a-message")
    assert line.startswith(f"a-message POST /v1/messages 200 id={message['id']} prompt_tokens=")
    assert " completion_tokens=4 " in line and line.endswith("finish_reason=length")
    assert f"error={json.dumps(bad.json()['error']['message'])}" in wait_for_line(caplog, "bad-message")


def test_a_request_without_an_id_gets_one(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="openai_serve.requests")
    with server.http() as http:
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 3})
        bad_id = http.get("/v1/models", headers={"X-Request-Id": "two words"})  # not a usable id: replaced
    request_id = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    assert re.fullmatch(r"[0-9a-f]{32}", bad_id.headers["x-request-id"])
    assert f" POST /v1/completions 200 id={response.json()['id']} prompt_tokens=" in wait_for_line(caplog, request_id)


def test_4xx_reasons_are_logged(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="openai_serve.requests")
    with server.http() as http:
        bad = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": -1},
                        headers={"X-Request-Id": "bad-temperature"})
        http.headers.pop("Authorization")
        unauthorized = http.get("/v1/models", headers={"X-Request-Id": "no-key"})
    assert bad.status_code == 400 and unauthorized.status_code == 401
    assert unauthorized.headers["x-request-id"] == "no-key"
    line = wait_for_line(caplog, "bad-temperature")
    assert line.startswith("bad-temperature POST /v1/completions 400 ")
    assert f"error={json.dumps(bad.json()['error']['message'])}" in line
    assert 'error="Incorrect or missing API key' in wait_for_line(caplog, "no-key")


def test_the_stats_line_shows_while_busy_and_quiets_when_idle(server: RunningServer,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="openai_serve.stats")
    server.wait_idle()
    time.sleep(0.5)  # two intervals with nothing to do: the lines are DEBUG now
    caplog.clear()
    server.client().completions.create(model=MODEL, prompt="count", max_tokens=200, extra_body={"ignore_eos": True})
    time.sleep(0.7)
    records = [r for r in caplog.records if r.name == "openai_serve.stats"]
    busy = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert busy, [r.getMessage() for r in records]
    assert any(re.search(r"Avg generation throughput: [1-9][\d.]* tokens/s", line) for line in busy), busy
    assert all("Running: " in line and "KV cache usage: " in line and "Prefix cache hit rate: " in line
               for line in busy)
    assert records[-1].levelno == logging.DEBUG  # idle again
