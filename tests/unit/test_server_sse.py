"""The SSE response on its own, driven through ASGI by hand: framing, one body message per batch,
[DONE] last, errors as an event, pings while idle, and a disconnect that cancels the stream and
still runs the cleanup."""

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from openai_serve import sse
from openai_serve.errors import service_unavailable
from openai_serve.sse import Batch, EventStreamResponse


class Client:
    """An ASGI peer: records what is sent; `receive` blocks until `leave()`."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self._left = asyncio.Event()

    async def send(self, message: dict) -> None:
        self.messages.append(message)

    async def receive(self) -> dict:
        await self._left.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self._left.set()

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body"]


def run(batches: AsyncIterator[Batch], client: Client, closed: list[str]) -> None:
    response = EventStreamResponse(batches, lambda: closed.append("closed"))
    scope = {"type": "http", "method": "POST"}
    asyncio.run(asyncio.wait_for(response(scope, client.receive, client.send), 5))


def test_each_batch_is_one_body_message_then_done_ends_the_body() -> None:
    async def batches() -> AsyncIterator[Batch]:
        yield [{"a": 1}, {"b": "é"}]
        yield [{"c": None}]

    client, closed = Client(), []
    run(batches(), client, closed)
    start = client.messages[0]
    headers = dict(start["headers"])
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8" and b"content-length" not in headers
    assert headers[b"cache-control"] == b"no-store"
    assert client.bodies == [b'data: {"a":1}\n\ndata: {"b":"\xc3\xa9"}\n\n', b'data: {"c":null}\n\n',
                             b"data: [DONE]\n\n"]
    assert [m.get("more_body") for m in client.messages[1:]] == [True, True, False]
    assert closed == ["closed"]


def test_an_api_error_mid_stream_is_an_error_event_then_done() -> None:
    async def batches() -> AsyncIterator[Batch]:
        yield [{"a": 1}]
        raise service_unavailable("The server is shutting down.", "shutting_down")

    client, closed = Client(), []
    run(batches(), client, closed)
    error = orjson.loads(client.bodies[1].removeprefix(b"data: "))
    assert error["error"]["code"] == "shutting_down"
    assert client.bodies[-1] == b"data: [DONE]\n\n" and closed == ["closed"]


def test_a_disconnect_cancels_the_stream_and_still_runs_its_cleanup() -> None:
    cleaned_up: list[str] = []
    client = Client()

    async def batches() -> AsyncIterator[Batch]:
        try:
            yield [{"a": 1}]
            client.leave()
            await asyncio.sleep(3600)  # waiting for a token that will never be needed
            yield [{"never": "sent"}]
        finally:
            cleaned_up.append("generator")

    closed: list[str] = []
    run(batches(), client, closed)
    assert cleaned_up == ["generator"] and closed == ["closed"]
    assert client.bodies == [b'data: {"a":1}\n\n']  # no [DONE] to a client that left


def test_an_idle_stream_sends_pings_as_comments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "PING_INTERVAL_S", 0.05)

    async def batches() -> AsyncIterator[Batch]:
        await asyncio.sleep(0.3)  # a request waiting long for its first token
        yield [{"a": 1}]

    client, closed = Client(), []
    run(batches(), client, closed)
    pings = [b for b in client.bodies if b.startswith(b":")]
    assert 2 <= len(pings) <= 7 and all(b == b": ping\n\n" for b in pings)
    assert client.bodies[-2:] == [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]


def test_a_cancelled_response_runs_the_cleanup_and_stays_cancelled() -> None:
    cleaned_up: list[str] = []

    async def batches() -> AsyncIterator[Batch]:
        try:
            yield [{"a": 1}]
            await asyncio.sleep(3600)  # a client that never leaves, at a server that shuts down
            yield []
        finally:
            cleaned_up.append("generator")

    async def scenario() -> None:
        client, closed = Client(), []
        response = EventStreamResponse(batches(), lambda: closed.append("closed"))
        task = asyncio.ensure_future(response({"type": "http", "method": "POST"}, client.receive, client.send))
        while not client.bodies:
            await asyncio.sleep(0.01)
        task.cancel()  # uvicorn's graceful-shutdown timeout
        with pytest.raises(asyncio.CancelledError):
            await task
        assert closed == ["closed"] and cleaned_up == ["generator"]

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_typed_framing_names_each_event_and_sends_no_done() -> None:
    async def batches() -> AsyncIterator[Batch]:
        yield [{"type": "response.created", "sequence_number": 0}, {"type": "response.completed"}]

    client, closed = Client(), []
    response = EventStreamResponse(batches(), lambda: closed.append("closed"), sse.TYPED)
    asyncio.run(asyncio.wait_for(response({"type": "http", "method": "POST"}, client.receive, client.send), 5))
    assert client.bodies == [b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
                             b'event: response.completed\ndata: {"type":"response.completed"}\n\n', b""]
    assert closed == ["closed"]
