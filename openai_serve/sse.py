"""Server-sent events the way OpenAI streams them: `data: <json>` events, then `data: [DONE]`.

An error after the stream has started (server shutdown, engine failure) is sent as one event in
OpenAI's error shape, which the official SDK raises as an APIError, followed by `[DONE]`.
"""

from collections.abc import AsyncIterator, Callable

import anyio
import orjson
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from openai_serve.errors import APIError

DONE = "[DONE]"
# After uvicorn begins to exit, streams get this long to send their terminal events themselves.
_SHUTDOWN_GRACE_S = 2.0


def encode(payload: dict[str, object]) -> str:
    return orjson.dumps(payload).decode()


def event_stream(events: AsyncIterator[dict[str, object]], on_close: Callable[[], None]) -> EventSourceResponse:
    """`on_close` runs when the response ends, however it ends (it aborts what is still running)."""
    return EventSourceResponse(
        _with_done(events), sep="\n", background=BackgroundTask(on_close),
        shutdown_event=anyio.Event(), shutdown_grace_period=_SHUTDOWN_GRACE_S,
    )


async def _with_done(events: AsyncIterator[dict[str, object]]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield encode(event)
    except APIError as error:
        yield encode(error.to_dict())
    yield DONE
