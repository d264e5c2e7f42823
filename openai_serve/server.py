"""uvicorn's server, with its HTTP protocol guarded (http_protocol.py: a connection cap, header
timeouts, size limits, errors in OpenAI's shape), plus two rules: the moment shutdown begins, the
engine bridge drains; and with `--exit-on-engine-failure` a failed engine ends the server, with exit
status 1.

uvicorn waits for open connections before it runs the lifespan's shutdown, and a stream can run
for minutes; so on SIGINT/SIGTERM (or `request_shutdown()`) running requests get their terminal
event at once and new ones a 503, and only then does uvicorn close the listening socket.
"""

import asyncio
import logging
import resource
import socket
import sys

import uvicorn
from starlette.applications import Starlette

from core.startup_gc import freeze_startup_objects
from openai_serve.engine_bridge import EngineState
from openai_serve.http_protocol import guarded_protocol
from openai_serve.server_config import ServerConfig

logger = logging.getLogger(__name__)

# Connections still open this long after shutdown began are closed anyway.
_GRACEFUL_SHUTDOWN_S = 10
# File descriptors kept beside the connections: the engine's pipes, model files, logs, the listener.
_RESERVED_FILES = 128


class ServingServer(uvicorn.Server):
    def __init__(self, app: Starlette, config: ServerConfig) -> None:
        max_connections = _fit_open_files_limit(config.max_connections)
        super().__init__(uvicorn.Config(
            app, host=config.host, port=config.port, log_level=config.log_level, lifespan="on",
            access_log=False,  # openai_serve/request_log.py logs each request, with more in its line
            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S, timeout_keep_alive=config.timeout_keep_alive,
            http=guarded_protocol(max_connections, config.request_header_timeout),
        ))
        self._app = app
        self._exit_on_engine_failure = config.exit_on_engine_failure
        self.exit_code = 0  # for the process, once `serve` returns
        self._switch_interval_s = config.gil_switch_interval_ms / 1e3
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        sys.setswitchinterval(self._switch_interval_s)  # process-wide: this process is the server
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # What is alive once the app has started (hundreds of thousands of objects) stays alive; each full
        # collection would walk it holding the interpreter lock, and the event loop would stand still meanwhile.
        freeze_startup_objects()

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s): also ends the server when its engine failed for good and it was
        asked to exit then (its requests already had their terminal events)."""
        state = getattr(self._app.state, "serving", None)
        if self._exit_on_engine_failure and state is not None and state.bridge.state is EngineState.FAILED:
            if not self.should_exit:
                logger.error("the engine failed: exiting (--exit-on-engine-failure)")
            self.exit_code, self.should_exit = 1, True
        return await super().on_tick(counter)

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


def _fit_open_files_limit(max_connections: int) -> int:
    """Raises this process's open-files limit so that `max_connections` fit (as far as the hard limit
    allows); returns the connection cap that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    fitting = max_connections if soft == resource.RLIM_INFINITY else min(max_connections, soft - _RESERVED_FILES)
    if fitting < max_connections:
        logger.warning("the open-files limit (%d) fits %d connections: --max-connections %d is lowered to it",
                       soft, fitting, max_connections)
    return max(1, fitting)
