"""Reading JSON bodies, and noticing a client that leaves before a non-streamed answer is ready."""

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from openai_serve.errors import APIError, bad_request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away; nobody is left to answer."""


async def read_json(request: Request) -> object:
    """The body as JSON; a 408 when the client does not send all of it within --request-body-timeout."""
    timeout_s = request.app.state.serving.config.request_body_timeout  # (state.py imports this module's users)
    try:
        async with asyncio.timeout(timeout_s):
            body = await request.body()
    except TimeoutError as exc:
        raise APIError(408, f"The request's body did not arrive within {timeout_s:g} s.",
                       code="request_timeout", closes_connection=True) from exc
    except ClientDisconnect as exc:  # nobody reads this answer: it only keeps the log clean of tracebacks
        raise APIError(499, "The client closed the connection before its body arrived.",
                       code="client_closed_request") from exc
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`, cancelling it (so its cleanup aborts the engine requests) if the client leaves."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (or the response is complete, as the server reports it)."""
    # The body has been read, so the next message the server hands us is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
