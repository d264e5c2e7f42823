"""One log line per HTTP request, and its X-Request-Id.

The middleware, outermost in the app, takes the client's `X-Request-Id` (or makes one), returns it
on every response, and once the response has ended logs one line on the `openai_serve.requests`
logger: the id, method and path, status, then for a generation its prompt, completion and cached
tokens, time to first token, total time and finish reasons, and for an error (status >= 400) the
message of the error body. /health and /metrics are polled all the time: their lines are DEBUG.
uvicorn's own access log is off (server.py): this line replaces it.

A route that generates fills in the `RequestRecord` the middleware puts in the request's state.
"""

import json
import logging
import time
import uuid
from dataclasses import dataclass, field

import orjson
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("openai_serve.requests")

REQUEST_ID_HEADER = "X-Request-Id"
_MAX_REQUEST_ID_LENGTH = 128
_QUIET_PATHS = frozenset({"/health", "/metrics"})
_RECORD_KEY = "request_record"
# The status nginx logs for a client that left before the answer: uvicorn sends nothing then.
_CLIENT_CLOSED_REQUEST = 499


@dataclass
class RequestRecord:
    request_id: str
    method: str
    path: str
    start: float = field(default_factory=time.monotonic)
    status: int | None = None
    error: str | None = None  # the error body's message
    response_id: str | None = None  # the `id` of a generation's response
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    first_token_time: float | None = None  # time.monotonic()
    finish_reasons: list[str] = field(default_factory=list)

    def line(self, now: float) -> str:
        parts = [f"{self.request_id} {self.method} {self.path} {self.status or _CLIENT_CLOSED_REQUEST}"]
        if self.response_id is not None:
            parts.append(f"id={self.response_id}")
        if self.prompt_tokens is not None:
            parts.append(f"prompt_tokens={self.prompt_tokens} completion_tokens={self.completion_tokens} "
                         f"cached_tokens={self.cached_tokens}")
        if self.first_token_time is not None:
            parts.append(f"ttft={self.first_token_time - self.start:.3f}s")
        parts.append(f"total={now - self.start:.3f}s")
        if self.finish_reasons:
            parts.append(f"finish_reason={','.join(self.finish_reasons)}")
        if self.error is not None:
            parts.append(f"error={json.dumps(self.error)}")  # quoted and escaped: one line, whatever it holds
        return " ".join(parts)


def request_record(request: Request) -> RequestRecord | None:
    """This request's record; None outside the app's middleware (a route called directly)."""
    return request.scope.get("state", {}).get(_RECORD_KEY)


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(_request_id(scope), scope["method"], scope["path"])
        scope.setdefault("state", {})[_RECORD_KEY] = record
        id_header = (REQUEST_ID_HEADER.lower().encode(), record.request_id.encode())

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), id_header]}
            elif message["type"] == "http.response.body" and (record.status or 0) >= 400 and record.error is None:
                record.error = _error_message(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            record.status = record.status or 500  # the server's error middleware answers it, outside this one
            raise
        finally:
            level = logging.DEBUG if record.path in _QUIET_PATHS and record.status == 200 else logging.INFO
            if logger.isEnabledFor(level):
                logger.log(level, "%s", record.line(time.monotonic()))


def _request_id(scope: Scope) -> str:
    """The client's X-Request-Id if it is a reasonable one (visible ASCII, not too long), else a new one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if 0 < len(value) <= _MAX_REQUEST_ID_LENGTH and all(0x21 <= byte <= 0x7E for byte in value):
                return value.decode()
            break
    return uuid.uuid4().hex


def _error_message(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode(errors="replace")
