"""Anthropic's Messages API on the wire, as a client without the SDK sees it: the stream's named events
in Anthropic's order (indices, block types, final usage), errors in Anthropic's shape with its
statuses and the field named, other routes' errors still in OpenAI's, the headers and query Claude
Code sends, unknown fields named, and a client that leaves mid-stream freeing its KV blocks."""

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.anthropic_api import assert_anthropic_error
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, start_server
from tests.e2e.sse_client import iter_typed_events

BODY = {"model": MODEL, "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Hello there"}]}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,context-1m-2025-08-07"}


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir)
    yield running
    running.stop()


def stream_events(http: httpx.Client, body: dict) -> list[tuple[str | None, dict]]:
    with http.stream("POST", "/v1/messages?beta=true", json=body | {"stream": True},
                     headers=ANTHROPIC_HEADERS) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        return list(iter_typed_events(response.iter_lines()))


def test_the_stream_is_anthropics_event_sequence(server: RunningServer) -> None:
    with server.http() as http:
        events = stream_events(http, BODY)
        in_full = http.post("/v1/messages", json=BODY, headers=ANTHROPIC_HEADERS).json()
    assert all(name == data["type"] for name, data in events), "every event is named by its type"
    names = [name for name, _ in events]
    num_deltas = names.count("content_block_delta")
    assert num_deltas >= 1 and names == ["message_start", "ping", "content_block_start",
                                         *["content_block_delta"] * num_deltas, "content_block_stop",
                                         "message_delta", "message_stop"]
    data = [payload for _, payload in events]
    start = data[0]["message"]
    assert start["id"].startswith("msg_") and start["type"] == "message" and start["role"] == "assistant"
    assert start["content"] == [] and start["stop_reason"] is None and start["model"] == MODEL
    assert start["usage"]["output_tokens"] == 0 and start["usage"]["cache_read_input_tokens"] == 0
    assert data[2] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [d for d in data if d["type"] == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert data[-3] == {"type": "content_block_stop", "index": 0}
    final = data[-2]
    assert final["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == 6 == in_full["usage"]["output_tokens"]
    assert set(final["usage"]) == {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                                   "output_tokens"}
    prompt = final["usage"]["input_tokens"] + final["usage"]["cache_read_input_tokens"]
    assert prompt == in_full["usage"]["input_tokens"] + in_full["usage"]["cache_read_input_tokens"]
    assert start["usage"]["input_tokens"] == prompt  # before the engine starts, the whole prompt
    assert "".join(d["delta"]["text"] for d in deltas) == in_full["content"][0]["text"]
    assert set(in_full) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}


def test_a_forced_tool_use_streams_as_a_tool_use_block(server: RunningServer) -> None:
    tool = {"name": "pick", "input_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                             "required": ["ok"], "additionalProperties": False}}
    body = BODY | {"max_tokens": 64, "tools": [tool], "tool_choice": {"type": "tool", "name": "pick"}}
    with server.http() as http:
        data = [payload for _, payload in stream_events(http, body)]
    start = data[2]
    assert start["type"] == "content_block_start" and start["index"] == 0
    block = start["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "pick" and block["input"] == {}
    assert block["id"].startswith("toolu_")
    pieces = [d["delta"] for d in data if d["type"] == "content_block_delta"]
    assert pieces and all(piece["type"] == "input_json_delta" for piece in pieces)
    assert isinstance(json.loads("".join(piece["partial_json"] for piece in pieces))["ok"], bool)
    assert data[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(("change", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": "6"}, "max_tokens"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]},
     "messages[0].content[0].type"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "sometimes"}},
     "tool_choice.type"),
    ({"temperature": 2}, "temperature"),
    ({"stop_sequences": "END"}, "stop_sequences"),
])
def test_bad_requests_are_anthropics_invalid_request_errors_naming_the_field(
    server: RunningServer, change: dict, param: str
) -> None:
    body = {key: value for key, value in (BODY | change).items() if value is not None}
    for stream in (False, True):
        with server.http() as http:
            error = assert_anthropic_error(http.post("/v1/messages", json=body | {"stream": stream}), 400)
        assert error["type"] == "invalid_request_error" and param in error["message"]


def test_other_errors_have_anthropics_types_and_statuses(server: RunningServer) -> None:
    with server.http() as http:
        unknown_model = http.post("/v1/messages", json=BODY | {"model": "claude-opus-4-8"})
        assert assert_anthropic_error(unknown_model, 404)["type"] == "not_found_error"
        assert "claude-opus-4-8" in unknown_model.json()["error"]["message"]
        not_json = http.post("/v1/messages", content=b"{nope", headers={"content-type": "application/json"})
        assert assert_anthropic_error(not_json, 400)["type"] == "invalid_request_error"
        assert assert_anthropic_error(http.get("/v1/messages"), 405)["type"] == "invalid_request_error"
        assert assert_anthropic_error(http.post("/v1/messages/nothing", json=BODY), 404)["type"] == "not_found_error"
        counted = http.post("/v1/messages/count_tokens", json={"model": "nope", "messages": BODY["messages"]})
        assert assert_anthropic_error(counted, 404)["type"] == "not_found_error"
        # The other APIs keep OpenAI's shape.
        assert_error_shape(http.post("/v1/chat/completions", json={"model": MODEL}), 400)


def test_the_sdk_raises_anthropics_errors(server: RunningServer) -> None:
    import anthropic

    client = server.anthropic()
    with pytest.raises(anthropic.NotFoundError) as not_found:
        client.messages.create(model="claude-haiku-4-5", max_tokens=4, messages=BODY["messages"])
    assert not_found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])


def test_unknown_fields_are_named_and_claude_codes_headers_accepted(server: RunningServer) -> None:
    with server.http() as http:
        response = http.post("/v1/messages?beta=true", json=BODY | {"mood": "calm"}, headers=ANTHROPIC_HEADERS)
    assert response.status_code == 200 and response.headers["x-ignored-fields"] == "mood"


def test_a_client_that_leaves_mid_stream_frees_its_blocks(server: RunningServer) -> None:
    body = BODY | {"max_tokens": 1500, "ignore_eos": True, "stream": True}
    with server.http() as http, http.stream("POST", "/v1/messages", json=body) as response:
        for name, _ in iter_typed_events(response.iter_lines()):
            if name == "content_block_delta":
                break
    metrics = server.wait_idle()
    assert metrics["num_kv_blocks_used"] == 0 and metrics["num_requests_running"] == 0
