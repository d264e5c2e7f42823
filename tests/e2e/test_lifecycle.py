"""Overload and shutdown: 503s in OpenAI's shape (529s in Anthropic's on its Messages API), terminal
events for running requests (the Responses API's and the Messages API's too), blocks freed."""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from orjson import loads

from tests.e2e.anthropic_api import assert_anthropic_error
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, server_config, start_server
from tests.e2e.sse_client import DONE, iter_events

LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
LONG_RESPONSE = {"model": MODEL, "input": "Once upon a time", "max_output_tokens": 400, "ignore_eos": True}
LONG_MESSAGE = {"model": MODEL, "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 400,
                "ignore_eos": True}


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, server_config(max_pending_requests=2))
    yield running
    running.stop()


class BackgroundStream:
    """A raw SSE stream read on a thread; `first_event` is set once data arrived."""

    def __init__(self, server: RunningServer, body: dict, path: str = "/v1/completions") -> None:
        self.events: list[str] = []
        self.first_event = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(server, body, path), daemon=True)
        self._thread.start()
        assert self.first_event.wait(30), "the stream did not start"

    def _read(self, server: RunningServer, body: dict, path: str) -> None:
        with server.http() as http, http.stream("POST", path, json=body | {"stream": True}) as r:
            for event in iter_events(r.iter_lines()):
                self.events.append(event)
                self.first_event.set()
                if self._stop.is_set():
                    return

    def close(self) -> None:
        self._stop.set()
        self.join()

    def join(self) -> None:
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()


def test_overload_is_503_with_retry_after(server: RunningServer) -> None:
    streams = [BackgroundStream(server, LONG), BackgroundStream(server, LONG)]
    with server.http() as http:
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
        assert assert_error_shape(response, 503)["code"] == "overloaded"
        assert response.headers["retry-after"] == "1"
        message = http.post("/v1/messages", json=LONG_MESSAGE | {"max_tokens": 1})
        assert assert_anthropic_error(message, 529)["type"] == "overloaded_error"
        assert message.headers["retry-after"] == "1"
        for stream in streams:
            stream.close()
        assert server.wait_idle()["num_kv_blocks_used"] == 0
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1}).status_code == 200
        # More generations than can ever run at once: no retry would help, so a 400 rather than a 503.
        too_many = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1, "n": 3})
        assert assert_error_shape(too_many, 400)["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model=MODEL, prompt="hi", max_tokens=1, n=3)


def in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    return thread, result


# The shutdown test's requests must still be running when the drain comes, however slowly a loaded machine
# starts the others: they ask for as many tokens as the tiny model's context leaves, not the 400 above.
SHUTDOWN_CONTEXT = 2048
SHUTDOWN_TOKENS = 2000


@pytest.fixture
def own_server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, max_model_len=SHUTDOWN_CONTEXT)
    yield running
    running.stop()


def wait_in_flight(server: RunningServer, count: int, timeout: float = 30.0) -> None:
    """Until the engine has `count` requests: every request sent is running (or waiting) there."""
    deadline = time.monotonic() + timeout
    while server.metrics()["num_requests_in_flight"] < count:
        assert time.monotonic() < deadline, "the requests did not reach the engine"
        time.sleep(0.02)


def test_shutdown_ends_running_requests_and_refuses_new_ones(own_server: RunningServer) -> None:
    running = own_server
    long = LONG | {"max_tokens": SHUTDOWN_TOKENS}
    long_response = LONG_RESPONSE | {"max_output_tokens": SHUTDOWN_TOKENS}
    long_message = LONG_MESSAGE | {"max_tokens": SHUTDOWN_TOKENS}
    stream = BackgroundStream(running, long)
    responses_stream = BackgroundStream(running, long_response, "/v1/responses")
    messages_stream = BackgroundStream(running, long_message, "/v1/messages")
    sdk_response = {k: v for k, v in long_response.items() if k != "ignore_eos"}
    background = running.client().responses.create(background=True, extra_body={"ignore_eos": True}, **sdk_response)
    waiting, answer = in_thread(lambda: httpx.post(running.base_url + "/v1/completions", json=long, timeout=30))
    responses_waiting, response_answer = in_thread(
        lambda: httpx.post(running.base_url + "/v1/responses", json=long_response, timeout=30))
    messages_waiting, message_answer = in_thread(
        lambda: httpx.post(running.base_url + "/v1/messages", json=long_message, timeout=30))
    sdk_body = {k: v for k, v in long.items() if k != "ignore_eos"}
    sdk_stream = running.client().completions.create(stream=True, extra_body={"ignore_eos": True}, **sdk_body)
    next(iter(sdk_stream))
    wait_in_flight(running, 8)  # the three answers in full too: the drain ends them mid-answer, not at the door
    running.server.request_drain()

    stream.join()
    error = loads(stream.events[-2])["error"]
    assert stream.events[-1] == DONE and error["code"] == "shutting_down"
    waiting.join(timeout=30)
    assert assert_error_shape(answer[0], 503)["code"] == "shutting_down"
    # The Responses API: a stream ends with response.failed (no [DONE] there), an answer in full is a
    # 503, and a background response is failed.
    responses_stream.join()
    failed = loads(responses_stream.events[-1])
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert "shutting down" in failed["response"]["error"]["message"]
    responses_waiting.join(timeout=30)
    assert assert_error_shape(response_answer[0], 503)["code"] == "shutting_down"
    assert running.client().responses.retrieve(background.id).status == "failed"
    # Anthropic's Messages API: a stream ends with its `error` event, an answer in full is a 529.
    messages_stream.join()
    assert loads(messages_stream.events[-1])["error"]["type"] == "overloaded_error"
    messages_waiting.join(timeout=30)
    assert assert_anthropic_error(message_answer[0], 529)["type"] == "overloaded_error"
    with pytest.raises(openai.APIError, match="shutting down"):
        list(sdk_stream)
    with running.http() as http:
        assert assert_error_shape(http.post("/v1/completions", json=long), 503)["code"] == "shutting_down"
        assert http.get("/health").status_code == 503
    assert running.wait_idle()["num_kv_blocks_used"] == 0  # the engine thread still freed what was aborted
