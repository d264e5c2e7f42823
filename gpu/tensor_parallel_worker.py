"""One tensor-parallel rank in its own process: a ModelRunner on its shard, stepping through the engine's batches.

Started by gpu/tensor_parallel_runner.py as `python -m gpu.tensor_parallel_worker FD`, FD being its end of
a socket pair to the engine. Messages (pickled by multiprocessing.connection):
- engine -> worker: a `WorkerStart` first; then per step the bytes of gpu/batch_wire.encode (to rank 0, when
  the batch has token masks, followed by encode_mask's); b"" to stop.
- worker -> engine: ("ready", kv_cache_groups, has_cuda_graphs) | ("result", token_ids, logprobs,
  prompt_logprobs) | ("failed", text).
Rank 0 answers every step with a "result" in launch order; the other ranks only say "ready" or "failed".

On rank 0 a second thread waits for each launched step's tokens and sends them, so the main thread can
launch the next step as soon as it arrives (async scheduling works across the process boundary as it
does in one process). A worker ends when told to, when its engine's end of the socket closes, or when
its parent process is gone (checked every second, for a worker blocked in a collective); a collective
that waits past the group's timeout fails instead of hanging.
"""

import logging
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import torch

from gpu.batch_wire import decode, decode_mask
from gpu.config import RunnerConfig
from gpu.distributed import join_group
from gpu.model_runner import ModelRunner
from gpu.pending_step import PendingLogits, PendingStep

logger = logging.getLogger(__name__)

_PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class WorkerStart:
    config: RunnerConfig  # as the engine was given it; the worker picks its own device
    rank: int
    size: int
    store_port: int  # the engine's TCPStore on 127.0.0.1, where the ranks meet
    timeout_s: float  # how long a collective may wait for a peer
    device_type: str  # "cuda" or "cpu", resolved by the engine
    log_level: str


class _Sender:
    """Sends on the engine connection from either thread."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._connection.send(message)


def main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the engine stops us
    connection = Connection(fd)
    start: WorkerStart = connection.recv()
    logging.basicConfig(level=start.log_level,
                        format=f"%(asctime)s %(levelname)s %(name)s [rank {start.rank}]: %(message)s")
    _exit_with_parent(os.getppid())
    sender = _Sender(connection)
    try:
        runner = _start_runner(start)
    except Exception as exc:  # noqa: BLE001 - any start-up failure goes back to the engine as a message
        logger.exception("the worker failed to start")
        sender.send(("failed", f"rank {start.rank}: {type(exc).__name__}: {exc}"))
        sys.exit(1)
    sender.send(("ready", runner.kv_cache_groups, runner.decode is not None and bool(runner.decode.graphs)))
    try:
        _serve(runner, connection, sender)
    except Exception as exc:  # noqa: BLE001 - reported, then the process ends; the engine fails every request
        logger.exception("the worker failed")
        sender.send(("failed", f"rank {start.rank}: {type(exc).__name__}: {exc}"))
        os._exit(1)  # not a clean exit: peers may be blocked in a collective with us
    logging.shutdown()
    # Skips the interpreter's teardown of torch (seconds), which holds nothing to save, and the process group's:
    # the process's end frees its communicators, while NCCL's destroy_process_group can block a stopped engine's
    # ranks past the engine's wait for them.
    os._exit(0)


def _start_runner(start: WorkerStart) -> ModelRunner:
    device = "cpu"
    if start.device_type == "cuda":
        torch.cuda.set_device(start.rank)  # Triton and NCCL launch on the current device
        device = f"cuda:{start.rank}"
    elif "OMP_NUM_THREADS" not in os.environ:  # else the caller chose (the tests: one)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // start.size))  # the ranks share the cores
    tp = join_group(start.rank, start.size, start.store_port, torch.device(device), start.timeout_s)
    return ModelRunner(replace(start.config, device=device, tensor_parallel_size=start.size), tp)


def _serve(runner: ModelRunner, connection: Connection, sender: _Sender) -> None:
    launched: queue.SimpleQueue[PendingStep | None] = queue.SimpleQueue()
    results = None
    if runner.tp.is_first:
        results = threading.Thread(target=_send_results, args=(launched, sender), name="step-results", daemon=True)
        results.start()
    while True:
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):
            message = b""  # the engine is gone
        if not message:
            break
        pending = runner.launch(decode(message))
        if isinstance(pending, PendingLogits):  # rank 0, structured output: the masks come next
            pending = runner.sample_masked(pending, decode_mask(connection.recv_bytes()))
        if results is not None:
            launched.put(pending)
    launched.put(None)
    if results is not None:
        results.join()


def _send_results(launched: "queue.SimpleQueue[PendingStep | None]", sender: _Sender) -> None:
    while (pending := launched.get()) is not None:
        try:
            result = pending.result()  # waits for the device (the GIL is released meanwhile)
        except Exception as exc:  # noqa: BLE001
            logger.exception("a step failed on the device")
            sender.send(("failed", f"rank 0: {type(exc).__name__}: {exc}"))
            os._exit(1)
        try:
            sender.send(("result", result.token_ids, result.logprobs, result.prompt_logprobs))
        except OSError:
            return  # the engine is gone


def _exit_with_parent(parent_pid: int) -> None:
    """Ends this process when its parent is gone, even while the main thread waits in a collective."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]))
