"""The engine in a child process, behind the same surface the server uses of an in-process engine.

Why: in one process the engine thread and the HTTP event loop share Python's interpreter lock. A
step's host work (scheduling, batch building, launching) then waits, up to the switch interval,
whenever the loop is busy streaming, and under load the device idles between steps. In its own
process the engine never waits for the server's Python (vLLM runs its engine core the same way).

Wire: two one-way pipes of pickled tuples (not dataclasses: tuples pickle several times faster, and the
child pays that on its critical path).
- server -> engine: ("add", [(request_id, prompt_token_ids, params), ...]) (one HTTP request's) |
  ("abort", request_id) | ("stop",)
- engine -> server: ("ready", EngineInfo) | ("failed", message)
  | ("outputs", [output tuples], stats tuple, observations tuple or None)

In the child a receiver thread feeds the engine's thread-safe inbox while the main thread steps, so
the server's writes never wait for a step to end. Requests arrive checked, as the engine takes
them (the server checks them with `limits`, core/request_checks.py, in its own process, and keeps
their ids unique). Stats ride along with every outputs message (the last ones are current: the
engine only changes while it steps), and so do the timings the engine observed since its last
message (core/engine_metrics.py), kept here until taken.
"""

import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from core.config import EngineConfig
from core.engine_metrics import EngineObservations
from core.engine_stats import EngineStats
from core.outputs import RequestOutput
from core.startup_gc import freeze_startup_objects

# The engine, torch and the model code are imported by the child only (run_engine): the server's process starts the
# child first and imports what serving needs meanwhile.
if TYPE_CHECKING:
    from core.engine import LLMEngine
    from core.pooling_model import PoolingModel
    from core.pooling_params import PoolingParams
    from core.request_checks import EngineLimits
    from core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.25  # how often the idle child checks whether it should exit
_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know of the engine, sent once it is built."""

    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    limits: "EngineLimits"
    pooling: "PoolingModel | None"  # what it pools, when it is a pooling model
    stats: EngineStats
    frozen_objects: int  # start-up objects the child's garbage collector skips (gc.freeze)


class EngineProcess:
    """An LLMEngine in a spawned child process. `add_request`, `abort_request` and `stats` from any
    thread; `next_outputs` from one thread (the server's engine bridge)."""

    def __init__(self, config: EngineConfig, start_timeout_s: float = 900.0, log_level: str = "INFO") -> None:
        self._start(config, start_timeout_s, log_level)
        self.wait_until_ready()

    @classmethod
    def spawned(cls, config: EngineConfig, start_timeout_s: float = 900.0, log_level: str = "INFO") -> "EngineProcess":
        """The child started, not yet ready: call `wait_until_ready` before anything else. Meanwhile the caller does
        its own start-up work (the server imports and builds what serving needs while the child builds the engine)."""
        engine = cls.__new__(cls)
        engine._start(config, start_timeout_s, log_level)
        return engine

    def _start(self, config: EngineConfig, start_timeout_s: float, log_level: str) -> None:
        self.config = config
        self._start_timeout_s, self._log_level = start_timeout_s, log_level
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state, no threads forked
        requests_out, requests_in = context.Pipe(duplex=False)
        outputs_out, outputs_in = context.Pipe(duplex=False)
        self._process = context.Process(target=run_engine, args=(config, requests_out, outputs_in, log_level),
                                        name="openai-serve-engine", daemon=True)
        self._process.start()
        requests_out.close()
        outputs_in.close()
        self._requests, self._outputs = requests_in, outputs_out
        self._send_lock = threading.Lock()

    def wait_until_ready(self) -> "EngineProcess":
        """Waits for the child's engine (up to the start timeout); raises RuntimeError where it failed to start."""
        info = self._wait_until_ready(self._start_timeout_s)
        self.max_model_len, self.vocab_size = info.max_model_len, info.vocab_size
        self.eos_token_ids = info.eos_token_ids
        self.limits = info.limits
        self.pooling = info.pooling
        self._stats = info.stats
        self.frozen_start_up_objects = info.frozen_objects
        self._observations = EngineObservations.empty()  # received, not yet taken
        return self

    def _wait_until_ready(self, timeout_s: float) -> EngineInfo:
        try:
            if not self._outputs.poll(timeout_s):
                raise RuntimeError(f"the engine process did not start within {timeout_s:.0f} s")
            message = self._outputs.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise RuntimeError(f"the engine process exited while starting (exit code {self._process.exitcode})") \
                from exc
        except RuntimeError:
            self.close()
            raise
        if message[0] != "ready":
            self.close()
            raise RuntimeError(f"the engine process failed to start: {message[1]}")
        return message[1]

    def add_requests(self, requests: Sequence[tuple[str, list[int], "SamplingParams | PoolingParams"]]) -> None:
        """Sends checked requests (as LLMEngine.add_request takes each) in one message: one pickling (equal
        SamplingParams pickle once) and one write."""
        self._send(("add", list(requests)))

    def abort_request(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def take_observations(self) -> EngineObservations | None:
        """The engine's timings received since the last call (the thread of `next_outputs` only)."""
        if not self._observations:
            return None
        taken, self._observations = self._observations, EngineObservations.empty()
        return taken

    def next_outputs(self, idle_timeout: float) -> list[RequestOutput]:
        """The next step's outputs, or [] when none came within idle_timeout; raises RuntimeError
        when the engine failed or its process is gone."""
        try:
            if not self._outputs.poll(idle_timeout):
                return []
            message = self._outputs.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the engine process exited (exit code {self._process.exitcode})") from exc
        if message[0] == "failed":
            raise RuntimeError(message[1])
        _, rows, stats, observations = message
        self._stats = EngineStats(*stats)
        if observations is not None:
            self._observations.extend(EngineObservations(*observations))
        return [RequestOutput(*row) for row in rows]

    def close(self) -> None:
        """Stops the child (it aborts what runs) and waits for it; kills it if it does not exit."""
        try:
            self._send(("stop",))
        except RuntimeError:
            pass  # already gone
        self._process.join(_STOP_TIMEOUT_S)
        if self._process.is_alive():
            logger.warning("the engine process did not stop within %.0f s: killing it", _STOP_TIMEOUT_S)
            self._process.kill()
            self._process.join()
        self._requests.close()
        self._outputs.close()

    def restarted(self) -> "EngineProcess":
        """A new engine process in place of this failed one (which is killed if it still runs)."""
        if self._process.is_alive():
            self._process.kill()
        self.close()
        return EngineProcess(self.config, self._start_timeout_s, self._log_level)

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self._requests.send(message)
        except (OSError, ValueError) as exc:  # ValueError: the pipe was closed
            raise RuntimeError("the engine process is gone") from exc


# The child process.


def run_engine(config: EngineConfig, requests: Connection, outputs: Connection, log_level: str) -> None:
    """The child's main: build the engine, report ready, then step until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the server stops us
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    try:
        start = time.perf_counter()
        from core.engine import LLMEngine

        logger.info("imported the engine in %.1f s", time.perf_counter() - start)
        engine = LLMEngine(config)
    except Exception as exc:  # noqa: BLE001 - any start-up failure goes back to the server as a message
        logger.exception("the engine failed to start")
        outputs.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    # As in the server's process (openai_serve/server.py): a full collection walking start-up's objects would
    # otherwise land inside an engine step.
    frozen = freeze_startup_objects()
    outputs.send(("ready", EngineInfo(engine.max_model_len, engine.vocab_size, engine.eos_token_ids, engine.limits,
                                      engine.pooling, engine.stats(), frozen)))
    stop = threading.Event()
    threading.Thread(target=_receive, args=(engine, requests, stop), name="engine-inbox", daemon=True).start()
    try:
        while not stop.is_set():
            step_outputs = engine.next_outputs(_IDLE_POLL_S)
            if step_outputs:
                observations = engine.take_observations()
                outputs.send(("outputs", [_as_row(o) for o in step_outputs], astuple(engine.stats()),
                              None if observations is None else tuple(observations)))
    except Exception as exc:  # noqa: BLE001 - the server turns this into 503s for everything running
        logger.exception("the engine failed")
        outputs.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        engine.close()  # stops tensor-parallel workers


def _receive(engine: "LLMEngine", requests: Connection, stop: threading.Event) -> None:
    """Feeds the engine's inbox. A message it cannot take (it cannot unpickle one, or the engine refuses
    its shape) ends the engine process rather than this thread alone, which would leave the server's
    requests waiting for ever: the server sees the process gone, ends them, and starts a new one."""
    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):
            message = ("stop",)  # the server is gone
        except Exception:  # noqa: BLE001 - see the docstring
            logger.exception("a message from the server could not be read: the engine stops")
            message = ("stop",)
        kind = message[0]
        try:
            if kind == "add":
                engine.add_requests(message[1])
                continue
            if kind == "abort":
                engine.abort_request(message[1])
                continue
        except Exception:  # noqa: BLE001 - see the docstring
            logger.exception("the engine could not take a %r message: it stops", kind)
        stop.set()
        engine.abort_request("")  # an unknown id: aborts nothing, wakes an idle engine so it sees `stop`
        return


def _as_row(o: RequestOutput) -> tuple[Any, ...]:
    return (o.request_id, o.new_token_ids, o.new_logprobs, o.finish_reason, o.num_prompt_tokens,
            o.num_output_tokens, o.num_cached_prompt_tokens, o.prompt_logprobs, o.pooled)
