"""A scripted OpenAI-style streaming server for the load generator's tests (test-only).

It streams exactly the bytes a test wants with known delays, so what the client must measure is
known; a request's `model` field picks a behaviour. In a thread of the test (`Stub().app`), or as
a process of its own (`python tests/bench/stub_server.py PORT`), which bench.serve's `launched` can start,
time and stop as it does a real server.
"""

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FIRST_TOKEN_DELAY_S = 0.05
TOKEN_DELAY_S = 0.01


def chunk(text: str | None, usage: dict[str, int] | None = None, finish: str | None = None) -> bytes:
    choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": finish}]
    return b"data: " + json.dumps({"choices": choices, "usage": usage}).encode() + b"\n\n"


class Stub:
    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", lambda _: JSONResponse({"data": [{"id": "good"}]})),
            Route("/health", lambda _: JSONResponse({"status": "ok"})),
        ])

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        if body["model"] == "http-error":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        return StreamingResponse(self.stream(body), media_type="text/event-stream")

    async def stream(self, body: dict[str, object]) -> AsyncIterator[bytes]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            n = int(body["max_tokens"])  # type: ignore[call-overload]
            if body["model"] == "short":
                n -= 1
            yield b": keep-alive comment\n\n"
            for i in range(n):
                await asyncio.sleep(FIRST_TOKEN_DELAY_S if i == 0 else TOKEN_DELAY_S)
                yield chunk(f" w{i}")
                if body["model"] == "cut" and i == 1:
                    return
            yield chunk("", finish="length")
            yield chunk(None, usage={"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n})
            if body["model"] != "no-done":
                yield b"data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


@contextmanager
def running_stub() -> Iterator[tuple[Stub, str]]:
    """A Stub served by uvicorn in a thread of the test on a free port: (the stub, its base URL)."""
    app = Stub()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


if __name__ == "__main__":
    uvicorn.run(Stub().app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
