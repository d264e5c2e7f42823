"""uvicorn's server, plus one rule: the moment shutdown begins, the engine bridge drains.

uvicorn waits for open connections before it runs the lifespan's shutdown, and a stream can run
for minutes; so on SIGINT/SIGTERM (or `request_shutdown()`) running requests get their terminal
event at once and new ones a 503, and only then does uvicorn close the listening socket.
"""

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette

from openai_serve.server_config import ServerConfig

# Connections still open this long after shutdown began are closed anyway.
_GRACEFUL_SHUTDOWN_S = 10


class ServingServer(uvicorn.Server):
    def __init__(self, app: Starlette, config: ServerConfig) -> None:
        super().__init__(uvicorn.Config(
            app, host=config.host, port=config.port, log_level=config.log_level, lifespan="on",
            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        ))
        self._app = app
        self._switch_interval_s = config.gil_switch_interval_ms / 1e3
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        sys.setswitchinterval(self._switch_interval_s)  # process-wide: this process is the server
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: object) -> None:
        # A signal handler runs between any two bytecodes of the loop's thread, maybe inside the
        # bridge's own code: the drain is scheduled as a callback rather than run here.
        self.request_drain()
        super().handle_exit(sig, frame)  # type: ignore[arg-type]

    def begin_drain(self) -> None:
        """Event loop thread only: running requests end with a terminal event, new ones get 503."""
        state = getattr(self._app.state, "serving", None)
        if state is not None:
            state.bridge.begin_shutdown()

    def request_drain(self) -> None:
        """Any thread: `begin_drain` without exiting (the server keeps answering, with 503s)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.begin_drain)

    def request_shutdown(self) -> None:
        """Any thread: drain, then exit as a signal would."""
        self.request_drain()
        self.should_exit = True
