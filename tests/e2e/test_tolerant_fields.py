"""Tolerant where clients are sloppy, strict where values matter, end to end: unknown fields are
ignored, logged once per name and named in X-Ignored-Fields (a 400 with --strict-request-fields);
what the SDK hands back as a reply goes back as history."""

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from openai_serve.ignored_fields import HEADER
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, server_config, start_server
from tests.e2e.sse_client import post_stream

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Hello!"}]
M = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3}


@pytest.fixture(scope="module")
def strict_server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, server_config(strict_request_fields=True))
    yield running
    running.stop()


def test_unknown_fields_are_ignored_and_named(server: RunningServer) -> None:
    body = M | {"num_ctx": 2048, "keep_alive": "5m", "messages": [{"role": "user", "content": "hi", "mood": 1}]}
    with server.http() as http:
        response = http.post(CHAT, json=body)
        assert response.status_code == 200, response.text
        assert response.headers[HEADER] == "messages[0].mood, num_ctx, keep_alive"
        streamed = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2,
                                                      "stream": True, "use_mmap": True})
        assert streamed.status_code == 200 and streamed.headers[HEADER] == "use_mmap"
        assert HEADER not in http.post(CHAT, json=M).headers


def test_each_unknown_name_is_logged_once(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="openai_serve.ignored_fields"), server.http() as http:
        for index in range(3):
            messages = [*MESSAGES] * (index + 1)
            messages[-1] = {**messages[-1], "odd_key": index}
            assert http.post(CHAT, json=M | {"tfs_z": 1, "messages": messages}).status_code == 200
    logged = [r.getMessage() for r in caplog.records if r.name == "openai_serve.ignored_fields"]
    assert len(logged) == 2, logged  # tfs_z once, messages[].odd_key once (whatever the index)
    assert any("field tfs_z " in m for m in logged) and any("field messages[].odd_key " in m for m in logged)


def test_a_header_never_carries_what_a_header_cannot(server: RunningServer) -> None:
    with server.http() as http:
        response = http.post(CHAT, json=M | {"bad\r\nX-Injected: 1": 1, "café": 2})
    assert response.status_code == 200 and "x-injected" not in response.headers
    assert response.headers[HEADER] == "bad\\r\\nX-Injected: 1, caf\\xe9"


def test_strict_server_answers_unknown_fields_with_a_400(strict_server: RunningServer) -> None:
    with strict_server.http() as http:
        error = assert_error_shape(http.post(CHAT, json=M | {"num_ctx": 2048}), 400)
        assert error["param"] == "num_ctx" and "Unrecognized request argument" in error["message"]
        assert http.post(CHAT, json=M | {"store": False, "metadata": {"a": "b"}}).status_code == 200


def test_a_reply_from_the_sdk_goes_back_as_history(server: RunningServer) -> None:
    client = server.client()
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    reply = first.choices[0].message.model_dump()  # annotations, audio: None, refusal: None, function_call ...
    history = [*MESSAGES, reply, {"role": "user", "content": [
        {"type": "text", "text": "And now?", "cache_control": {"type": "ephemeral"}}]}]
    second = client.chat.completions.create(model=MODEL, messages=history, max_tokens=3, parallel_tool_calls=False,
                                            store=True, metadata={"k": "v"}, service_tier="auto", user="me")
    assert second.choices[0].message.role == "assistant"
    with server.http() as http:
        thinking = {"role": "assistant", "content": "Yes.", "reasoning_content": "hmm", "name": "bot"}
        assert http.post(CHAT, json=M | {"messages": [*MESSAGES, thinking, *MESSAGES]}).status_code == 200


def test_streamed_responses_name_ignored_fields_too(server: RunningServer) -> None:
    with server.http() as http:
        with http.stream("POST", CHAT, json=M | {"stream": True, "repeat_last_n": 64}) as response:
            assert response.status_code == 200 and response.headers[HEADER] == "repeat_last_n"
        assert post_stream(http, CHAT, M | {"stream": True, "mirostat": 0}).chunks
