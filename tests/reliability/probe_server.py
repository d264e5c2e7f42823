"""A server in its own process for tests/reliability/test_big_bodies.py: the tiny model served as
`openai-serve` serves it (the engine in its own process), plus two test-only routes that measure the
server process from inside: how late its event loop ran (a task that sleeps 5 ms at a time and
records how much later it woke), and its memory.

    python -m tests.reliability.probe_server MODEL_DIR PORT_FILE [MAX_MODEL_LEN]

GET /_probe: {"worst_stall_ms", "rss_mib", "peak_rss_mib"}; POST /_probe/reset starts (or resets)
the stall measurement.
"""

import asyncio
import socket
import sys
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.engine_process import EngineProcess
from openai_serve.app import build_app
from openai_serve.server import ServingServer
from openai_serve.server_config import ServerConfig

_TICK_S = 0.005


class LoopProbe:
    def __init__(self) -> None:
        self.worst_stall_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        self.worst_stall_s = 0.0
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(_TICK_S)
            self.worst_stall_s = max(self.worst_stall_s, loop.time() - started - _TICK_S)


def memory_mib() -> tuple[float, float]:
    """This process's resident memory now and at its peak."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main(model_dir: str, port_file: str, max_model_len: int = 2048) -> None:
    engine = EngineProcess(EngineConfig(
        model=ModelConfig(model=model_dir, device="cpu", max_model_len=max_model_len),
        cache=CacheConfig(block_size=16, num_blocks=1024), scheduler=SchedulerConfig(max_num_seqs=64),
    ))
    config = ServerConfig(served_model_names=("tiny",), port=0, log_level="warning")
    app = build_app(engine, config)
    probe = LoopProbe()

    async def read(request: Request) -> JSONResponse:
        rss, peak = memory_mib()
        return JSONResponse({"worst_stall_ms": probe.worst_stall_s * 1e3, "rss_mib": rss, "peak_rss_mib": peak})

    async def reset(request: Request) -> JSONResponse:
        probe.reset()
        return JSONResponse({})

    app.router.routes += [Route("/_probe", read, methods=["GET"]), Route("/_probe/reset", reset, methods=["POST"])]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    ServingServer(app, config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
