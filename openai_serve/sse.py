"""Server-sent events the way OpenAI streams them: `data: <json>` events, then `data: [DONE]`, for
completions and chat; for the Responses API, typed events (`event: <type>` before each `data:`)
and no `[DONE]` (`TYPED`); for Anthropic's Messages API typed events too, kept alive by its own
`ping` event (`ANTHROPIC`).

An error after the stream has started (server shutdown, engine failure) is sent as one event in
OpenAI's error shape, which the official SDK raises as an APIError, followed by `[DONE]` (the
Messages API's stream sends Anthropic's `error` event itself: routes/anthropic.py).

This is the hot path of a streaming server (one event per request per engine step), so events are
framed here as bytes with orjson, and everything a view yields at once (a batch: the chunks of one
wake-up) goes out as ONE body message, so one socket write. sse-starlette did this job before, and is
not a dependency: even fed one pre-framed batch per wake-up, its per-send work (an anyio cancel scope
and a lock per send, a task group per response) cost the event loop more CPU per streamed token and
the server a fifth of its throughput under streaming load (docs/performance.md).
What it did that matters is kept: a disconnect ends the
stream at once (its cleanup aborts the engine requests), a comment line keeps idle connections open
through proxies, and `on_close` runs however the response ends. Server shutdown needs nothing here:
the bridge ends every stream with a terminal event.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from openai_serve.errors import APIError
from openai_serve.http_io import wait_for_disconnect

DONE_FRAME = b"data: [DONE]\n\n"
# A comment line (ignored by EventSource and the SDK) every so often while nothing else is sent,
# so proxies do not time out a stream that waits long for its first token. sse-starlette's period.
PING_INTERVAL_S = 15.0
_PING_FRAME = b": ping\n\n"
_HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}

Batch = list[dict[str, object]]


def frame(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def typed_frame(payload: dict[str, object]) -> bytes:
    """An event named by its payload's `type`, as the Responses API streams them."""
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass(frozen=True)
class Framing:
    frame: Callable[[dict[str, object]], bytes]
    end: bytes  # the last body message
    ping: bytes = _PING_FRAME  # what keeps an idle stream open

    def frames(self, batch: Batch) -> bytes:
        frame = self.frame
        return b"".join([frame(payload) for payload in batch])


DATA = Framing(frame, DONE_FRAME)
TYPED = Framing(typed_frame, b"")  # the stream's last event (response.completed ...) says it ended
ANTHROPIC = Framing(typed_frame, b"", typed_frame({"type": "ping"}))  # message_stop (or error) ends it


class EventStreamResponse(Response):
    """Streams each batch of events as one body message; the framing's end (`[DONE]`) goes with the end
    of the body."""

    media_type = "text/event-stream"

    def __init__(self, batches: AsyncIterator[Batch], on_close: Callable[[], None], framing: Framing = DATA) -> None:
        """`on_close` runs when the response ends, however it ends (it aborts what is still running)."""
        # As Starlette's StreamingResponse: no `body`, so no Content-Length (the body is chunked).
        self.status_code = 200
        self.background = None
        self.init_headers(_HEADERS)
        self._batches = batches
        self._on_close = on_close
        self._framing = framing
        self._last_write = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._last_write = asyncio.get_running_loop().time()
        stream = asyncio.ensure_future(self._stream(send))
        watchers = [asyncio.ensure_future(wait_for_disconnect(receive)), asyncio.ensure_future(self._ping(send))]
        try:
            await asyncio.wait({stream, watchers[0]}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in watchers:
                task.cancel()
            stream.cancel()  # the client left (or this task is cancelled): the generators' cleanup runs
            self._on_close()
            await asyncio.wait({stream})  # its cleanup done; a cancellation of this task still propagates
        if not stream.cancelled():
            stream.result()  # an unexpected error is raised as any route's would be

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for batch in self._batches:
                await self._write(send, self._framing.frames(batch))
        except APIError as error:  # an untyped `data:` event in OpenAI's error shape, whatever the framing
            await self._write(send, frame(error.to_dict()))
        await send({"type": "http.response.body", "body": self._framing.end, "more_body": False})

    async def _write(self, send: Send, body: bytes) -> None:
        self._last_write = asyncio.get_running_loop().time()
        await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _ping(self, send: Send) -> None:
        # One send never interleaves with another inside a message: the server writes each whole.
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self._last_write + PING_INTERVAL_S - loop.time()))
            if loop.time() - self._last_write >= PING_INTERVAL_S:
                await self._write(send, self._framing.ping)


def event_stream(
    batches: AsyncIterator[Batch], on_close: Callable[[], None], framing: Framing = DATA
) -> EventStreamResponse:
    return EventStreamResponse(batches, on_close, framing)
