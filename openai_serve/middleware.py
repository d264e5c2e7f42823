"""ASGI middleware: API-key authentication and the request body size limit.

Order in the app (outermost first): CORS, auth, body limit. CORS answers preflight requests
before auth sees them, since browsers send no Authorization header on a preflight.

The key is accepted as OpenAI's clients send it (`Authorization: Bearer <key>`) and as Anthropic's
do (`x-api-key: <key>`), on every route: a request is let in when either header holds it. Errors
are in the shape of the API the path belongs to (errors.py).
"""

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_serve.errors import APIError, duplicate_header, error_response, request_too_large, unauthorized
from openai_serve.web_ui import is_web_ui_path

# Liveness, version and metrics carry no model output; load balancers probe them without a key (as in vLLM).
# Nor does the chat page (web_ui.py): a browser loads it without one, and its API calls send the key.
UNAUTHENTICATED_PATHS = frozenset({"/health", "/version", "/metrics"})


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        # Each header that may carry the key, and its value when it does.
        self._expected = {b"authorization": f"Bearer {api_key}".encode(), b"x-api-key": api_key.encode()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _needs_no_key(scope):
            await self.app(scope, receive, send)
            return
        error = self._refusal(scope["headers"])
        if error is not None:
            await error_response(error, scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, headers: list[tuple[bytes, bytes]]) -> APIError | None:
        is_authorized = False
        for header, expected in self._expected.items():
            provided = [value for name, value in headers if name == header]
            if len(provided) > 1:  # which one counts differs from proxy to proxy: none does
                return duplicate_header(header.decode().title())
            # Every header is compared in full, whether or not one already matched: no key guessing by timing.
            is_authorized |= bool(provided) and hmac.compare_digest(provided[0], expected)
        return None if is_authorized else unauthorized()


def _needs_no_key(scope: Scope) -> bool:
    path = scope["path"]
    return path in UNAUTHENTICATED_PATHS or is_web_ui_path(path) or scope["method"] == "OPTIONS"


class BodySizeLimitMiddleware:
    """413 for a body over the limit: at once from Content-Length, or as soon as it streams past it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self._max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self._max_bytes:
            await error_response(request_too_large(self._max_bytes), scope["path"])(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _limited(self, receive: Receive) -> Receive:
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self._max_bytes:
                raise request_too_large(self._max_bytes)
            return message

        return limited_receive
