"""The one place that knows both worlds: the asyncio event loop and the engine.

The bridge's output thread ("engine-outputs") loops on `engine.next_outputs()`: for the engine in
its own process (the default, core/engine_process.py), the next step's outputs off the pipe; for an
engine in this process (--no-engine-process), one step, or a sleep on its inbox while idle, so that
the thread is then the engine's. It hands each step's outputs to the event loop with ONE
`call_soon_threadsafe` per step (never one per token). On the loop, `_dispatch` puts each output on
its HTTP request's `asyncio.Queue`.

Invariants:
- `_handles` (loop thread only) maps every engine request id still running to its handle; an id
  leaves it when the engine finishes it or when it is aborted, so late outputs are dropped. It is
  the server's one registry of live requests: a new request never takes a live one's id.
- Shutdown: every open handle gets a terminal `BridgeClosed` and its sequences are aborted; new
  submissions get a 503. If the engine fails (an exception in its step, its process gone), the same
  happens and `is_alive` turns false.
"""

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from core import RequestOutput, RequestRejected, SamplingParams
from core.serving_engine import ServingEngine
from openai_serve.errors import refused, service_unavailable

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.25  # how often an idle output thread checks whether it should exit


@dataclass(frozen=True)
class BridgeClosed:
    """The terminal event of a request whose engine went away (shutdown or engine failure)."""

    message: str
    code: str


class RequestHandle:
    """The engine requests behind one HTTP request, and the queue their outputs arrive on."""

    def __init__(self, bridge: "EngineBridge", request_ids: list[str]) -> None:
        self._bridge = bridge
        self.request_ids = request_ids
        self.queue: asyncio.Queue[RequestOutput | BridgeClosed] = asyncio.Queue()
        self._closed: BridgeClosed | None = None  # met while draining, raised on the next call

    async def next_output(self) -> RequestOutput:
        item = self._closed or await self.queue.get()
        if isinstance(item, BridgeClosed):
            raise service_unavailable(item.message, item.code)
        return item

    async def next_outputs(self) -> list[RequestOutput]:
        """Every output that has arrived, in order; waits for one if none has. A consumer that fell
        behind the engine by several steps thus catches up in one wake-up instead of one per step."""
        outputs = [await self.next_output()]
        queue = self.queue
        while not queue.empty():
            item = queue.get_nowait()
            if isinstance(item, BridgeClosed):
                self._closed = item  # the outputs before it are delivered first
                break
            outputs.append(item)
        return outputs

    def abort(self, request_id: str) -> None:
        self._bridge.abort(self, request_id)

    def close(self) -> None:
        """Aborts whatever is still running (a disconnect, a stop string, an error)."""
        for request_id in self.request_ids:
            self._bridge.abort(self, request_id)


class EngineBridge:
    def __init__(self, engine: ServingEngine, max_pending_requests: int) -> None:
        self._engine = engine
        self._max_pending = max_pending_requests
        self._handles: dict[str, RequestHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._should_exit = threading.Event()
        self._closed: BridgeClosed | None = None

    # Event loop side.

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-outputs", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self.begin_shutdown()
        self._should_exit.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self._engine.close)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._closed is None

    @property
    def num_pending_requests(self) -> int:
        return len(self._handles)

    def submit(self, requests: Sequence[tuple[str, list[int], SamplingParams]]) -> RequestHandle:
        """Adds all of an HTTP request's engine requests (checked: core/request_checks.py), or none (a
        refusal aborts the others)."""
        self._check_open(len(requests))
        handle = RequestHandle(self, [request_id for request_id, _, _ in requests])
        for request_id, prompt_token_ids, params in requests:
            try:
                if request_id in self._handles:
                    raise RequestRejected("request_id", f"request id {request_id!r} is already in use")
                self._handles[request_id] = handle
                self._engine.add_request(request_id, prompt_token_ids, params)
            except RequestRejected as exc:
                handle.close()
                raise refused(exc) from exc
        return handle

    def abort(self, handle: RequestHandle, request_id: str) -> None:
        if self._handles.get(request_id) is handle:
            del self._handles[request_id]
            self._engine.abort_request(request_id)

    def begin_shutdown(self) -> None:
        """New requests get 503 from now on; running ones get a terminal event and are aborted."""
        self._close_all(BridgeClosed("The server is shutting down.", "shutting_down"))

    def _check_open(self, num_new: int) -> None:
        if self._closed is not None:
            raise service_unavailable(self._closed.message, self._closed.code)
        if len(self._handles) + num_new > self._max_pending:
            raise service_unavailable(
                f"The server is overloaded: {len(self._handles)} requests are in flight (limit "
                f"{self._max_pending}). Retry shortly.", "overloaded",
            )

    def _close_all(self, event: BridgeClosed) -> None:
        if self._closed is None:
            self._closed = event
        handles = {id(h): h for h in self._handles.values()}.values()
        for handle in handles:
            handle.queue.put_nowait(event)
            handle.close()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            handle = self._handles.get(output.request_id)
            if handle is None:
                continue  # aborted on this side; the engine's last word on it is not needed
            handle.queue.put_nowait(output)
            if output.finish_reason is not None:
                del self._handles[output.request_id]

    def _engine_failed(self, message: str) -> None:
        self._close_all(BridgeClosed(f"The engine failed and cannot serve requests: {message}", "engine_failed"))

    # The output thread.

    def _run(self) -> None:
        assert self._loop is not None
        try:
            while not self._should_exit.is_set():
                outputs = self._engine.next_outputs(_IDLE_POLL_S)
                if outputs:
                    self._loop.call_soon_threadsafe(self._dispatch, outputs)
        except Exception as exc:
            logger.exception("the engine failed")
            self._loop.call_soon_threadsafe(self._engine_failed, f"{type(exc).__name__}: {exc}")
