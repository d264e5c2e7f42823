"""The one place that knows both worlds: the asyncio event loop and the engine.

The bridge's output thread ("engine-outputs") loops on `engine.next_outputs()`: for the engine in
its own process (the default, core/engine_process.py), the next step's outputs off the pipe; for an
engine in this process (--no-engine-process), one step, or a sleep on its inbox while idle, so that
the thread is then the engine's. It hands each step's outputs to the event loop with ONE
`call_soon_threadsafe` per step (never one per token). On the loop, `_dispatch` puts each output on
its HTTP request's `asyncio.Queue`. The engine's timings of that step go to `on_observations` (the
metrics) on this output thread, off the event loop.

Invariants:
- `_handles` (loop thread only) maps every engine request id still running to its handle; an id
  leaves it when the engine finishes it or when it is aborted, so late outputs are dropped. It is
  the server's one registry of live requests: a new request never takes a live one's id.
- Every handle ends with its requests' last outputs or with one terminal APIError on its queue:
  shutdown (503, and its requests are aborted), an engine failure (503, at once, for every handle;
  nothing is sent to the dead engine), a request the engine could not run (500, its siblings
  aborted), or a consumer that left `max_unread_steps` steps of output unread (a client that
  stopped reading: its requests are aborted, so they hold no KV blocks).
- A failed engine is replaced by the output thread (engine_restarts.py); meanwhile and after the
  server gave up, new requests get 503. `state` says which: what /health reports.
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from core import FinishReason, RequestOutput, RequestRejected, SamplingParams
from core.engine_metrics import EngineObservations
from core.serving_engine import ServingEngine
from openai_serve.engine_restarts import RestartPolicy
from openai_serve.errors import APIError, bad_request, refused, service_unavailable

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.25  # how often an idle output thread checks whether it should exit


class EngineState(Enum):
    SERVING = "serving"
    RESTARTING = "restarting"  # the engine failed; a new one is on its way
    FAILED = "failed"  # the engine failed and no restart is left (or asked for)
    SHUTTING_DOWN = "shutting_down"


_REFUSALS = {
    EngineState.RESTARTING: ("The engine failed and is restarting. Retry shortly.", "engine_restarting"),
    EngineState.FAILED: ("The engine failed and cannot serve requests.", "engine_failed"),
    EngineState.SHUTTING_DOWN: ("The server is shutting down.", "shutting_down"),
}


def request_failed() -> APIError:
    return APIError(500, "The engine could not run this request (the server's log has why).",
                    error_type="server_error", code="request_failed")


def unread(max_unread_steps: int) -> APIError:
    return APIError(408, f"The response was not read: its generation was stopped after {max_unread_steps} steps "
                    "of output went unread.", code="response_not_read")


class RequestHandle:
    """The engine requests behind one HTTP request, and the queue their outputs arrive on."""

    def __init__(self, bridge: "EngineBridge", request_ids: list[str], max_unread: int = 2**62) -> None:
        """`max_unread`: outputs (about one per request per step) it may leave unread before its requests
        are stopped."""
        self._bridge = bridge
        self.request_ids = request_ids
        self.queue: asyncio.Queue[RequestOutput | APIError] = asyncio.Queue()
        self._error: APIError | None = None  # met while draining, raised on the next call
        self.max_unread = max_unread

    async def next_output(self) -> RequestOutput:
        item = self._error or await self.queue.get()
        if isinstance(item, APIError):
            raise item
        return item

    async def next_outputs(self) -> list[RequestOutput]:
        """Every output that has arrived, in order; waits for one if none has. A consumer that fell
        behind the engine by several steps thus catches up in one wake-up instead of one per step."""
        outputs = [await self.next_output()]
        queue = self.queue
        while not queue.empty():
            item = queue.get_nowait()
            if isinstance(item, APIError):
                self._error = item  # the outputs before it are delivered first
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
    def __init__(self, engine: ServingEngine, max_pending_requests: int, restarts: RestartPolicy | None = None,
                 max_unread_steps: int = 512,
                 on_observations: Callable[[EngineObservations], None] | None = None) -> None:
        """`restarts`: when a failed engine is replaced (None: never). `max_unread_steps`: steps of output a
        request's consumer may leave unread before its requests are stopped. `on_observations`: gets the
        engine's timings (core/engine_metrics.py) as they come, on the output thread."""
        self.engine = engine  # replaced by a new one when it fails and is restarted
        self._on_observations = on_observations
        self.max_unread_steps = max_unread_steps
        self._max_pending = max_pending_requests
        self._restarts = restarts or RestartPolicy(max_restarts=0)
        self._handles: dict[str, RequestHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._should_exit = threading.Event()
        self.state = EngineState.SERVING
        self.num_restarts = 0

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
        await asyncio.to_thread(self.engine.close)

    def refusal(self) -> APIError | None:
        """Why new requests are refused now (a 503 naming the state), or None while the engine serves."""
        state = self.state
        if state is EngineState.SERVING and (self._thread is None or not self._thread.is_alive()):
            state = EngineState.FAILED
        return None if state is EngineState.SERVING else service_unavailable(*_REFUSALS[state])

    @property
    def num_pending_requests(self) -> int:
        return len(self._handles)

    def submit(self, requests: Sequence[tuple[str, list[int], SamplingParams]]) -> RequestHandle:
        """Adds all of an HTTP request's engine requests (checked: core/request_checks.py), or none (a
        refusal aborts the others). They go to the engine together: to an engine process, one message."""
        self._check_open(len(requests))
        request_ids = [request_id for request_id, _, _ in requests]
        handle = RequestHandle(self, request_ids, self.max_unread_steps * len(requests))
        seen: set[str] = set()
        for request_id in request_ids:  # live, or twice in this request
            if request_id in self._handles or request_id in seen:
                raise refused(RequestRejected("request_id", f"request id {request_id!r} is already in use"))
            seen.add(request_id)
        for request_id in request_ids:
            self._handles[request_id] = handle
        try:
            self.engine.add_requests(requests)
        except RequestRejected as exc:
            handle.close()
            raise refused(exc) from exc
        except RuntimeError as exc:  # the engine's process is gone; its failure is on its way here
            handle.close()
            raise service_unavailable("The engine failed and is restarting. Retry shortly.",
                                      "engine_restarting") from exc
        return handle

    def abort(self, handle: RequestHandle, request_id: str) -> None:
        if self._handles.get(request_id) is handle:
            del self._handles[request_id]
            try:
                self.engine.abort_request(request_id)
            except RuntimeError:
                pass  # the engine's process is gone: nothing runs there any more

    def begin_shutdown(self) -> None:
        """New requests get 503 from now on; running ones get a terminal event and are aborted."""
        self.state = EngineState.SHUTTING_DOWN
        self._end_all(lambda: service_unavailable(*_REFUSALS[EngineState.SHUTTING_DOWN]), abort=True)

    def _check_open(self, num_new: int) -> None:
        if (refusal := self.refusal()) is not None:
            raise refusal
        if num_new > self._max_pending:
            raise bad_request(f"The request asks for {num_new} generations (prompts x n); this server runs at most "
                              f"{self._max_pending} at a time (--max-pending-requests).", "n")
        if len(self._handles) + num_new > self._max_pending:
            raise service_unavailable(
                f"The server is overloaded: {len(self._handles)} requests are in flight (limit "
                f"{self._max_pending}). Retry shortly.", "overloaded",
            )

    def _end(self, handle: RequestHandle, error: APIError, abort: bool) -> None:
        """Ends a handle with a terminal error; its requests are aborted in the engine if `abort`."""
        for request_id in handle.request_ids:
            if self._handles.get(request_id) is handle:
                if abort:
                    self.abort(handle, request_id)
                else:
                    del self._handles[request_id]
        handle.queue.put_nowait(error)

    def _end_all(self, error: Callable[[], APIError], abort: bool) -> None:
        for handle in {id(h): h for h in self._handles.values()}.values():
            self._end(handle, error(), abort)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            handle = self._handles.get(output.request_id)
            if handle is None:
                continue  # aborted on this side; the engine's last word on it is not needed
            if output.finish_reason is FinishReason.ERROR:
                del self._handles[output.request_id]
                self._end(handle, request_failed(), abort=True)
                continue
            handle.queue.put_nowait(output)
            if output.finish_reason is not None:
                del self._handles[output.request_id]
            elif handle.queue.qsize() > handle.max_unread:
                logger.warning("a response left %d steps of output unread: its generation is stopped",
                               self.max_unread_steps)
                self._end(handle, unread(self.max_unread_steps), abort=True)

    def _engine_failed(self, message: str) -> None:
        """Every request ends at once; nothing is sent to the dead engine."""
        restarting = " It is restarting: retry shortly." if self.state is EngineState.RESTARTING else ""
        error = f"The engine failed: {message}.{restarting}"
        self._end_all(lambda: service_unavailable(error, "engine_failed"), abort=False)

    def _engine_restarted(self) -> None:
        if self.state is EngineState.RESTARTING:
            self.state = EngineState.SERVING
            self.num_restarts += 1

    def _engine_gave_up(self) -> None:
        if self.state is EngineState.RESTARTING:
            self.state = EngineState.FAILED

    # The output thread.

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: the server is gone

    def _run(self) -> None:
        engine: ServingEngine | None = self.engine
        while engine is not None and not self._should_exit.is_set():
            try:
                outputs = engine.next_outputs(_IDLE_POLL_S)
            except Exception as exc:  # noqa: BLE001 - the engine failed: every request ends, a new one starts
                logger.exception("the engine failed")
                engine = self._replace(engine, f"{type(exc).__name__}: {exc}")
                continue
            if outputs:
                self._post(self._dispatch, outputs)
            if self._on_observations is not None and (observations := engine.take_observations()):
                self._on_observations(observations)

    def _replace(self, failed: ServingEngine, message: str) -> ServingEngine | None:
        """A new engine in place of the failed one, after the policy's back-off; None when none is left."""
        delay = None if self._should_exit.is_set() else self._restarts.next_delay()
        if self.state is not EngineState.SHUTTING_DOWN:  # set here, so no request goes to the dead engine
            self.state = EngineState.FAILED if delay is None else EngineState.RESTARTING
        self._post(self._engine_failed, message)
        while delay is not None:
            logger.warning("restarting the engine in %.0f s (restart %d within %.0f min, at most %d)", delay,
                           self._restarts.num_recent, self._restarts.window_s / 60, self._restarts.max_restarts)
            if self._should_exit.wait(delay):
                return None
            started = time.monotonic()
            try:
                self.engine = failed.restarted()
            except Exception:  # noqa: BLE001 - a start that fails counts as a restart, and is retried
                logger.exception("the engine did not start again")
                delay = self._restarts.next_delay()
                continue
            logger.warning("the engine restarted in %.1f s", time.monotonic() - started)
            self._post(self._engine_restarted)
            return self.engine
        logger.error("the engine failed and is not restarted: the server answers 503 until it is restarted")
        self._post(self._engine_gave_up)
        return None
