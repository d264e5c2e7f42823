"""Tensor parallelism as the engine sees it: ModelRunner's surface, over one worker process per rank.

The engine (scheduler, block manager) stays in its own process and never touches a device. `launch`
packs the step's batch once (gpu/batch_wire.py), writes it to every worker (rank 0 also gets the
sampled rows' settings) and returns at once with a `RemoteStep`; `RemoteStep.result()` reads rank
0's tokens for that step. Workers answer in launch order, so with async scheduling the next step is
already on its way to the workers while the engine waits for this one's tokens, as in one process. A
batch with token masks returns `RemoteLogits` instead, and `sample_masked` sends rank 0 the masks (the
two-part launch ModelRunner has in one process).

The ranks meet at a TCPStore this process serves on a free local port and form one torch.distributed
group (NCCL on CUDA, gloo on CPU), rank r on cuda:r. Each loads only its slices of the checkpoint and
sizes its KV cache; the ranks agree on the smallest block count of each KV-cache group, which rank 0 reports.

Failure: while it waits for a worker this process also watches the others. A worker that exits or
reports an error, or a step that brings no result within STEP_TIMEOUT_S, kills every worker (the
survivors may be blocked in a collective with the dead one) and raises RuntimeError: the engine fails
every request with a terminal event instead of hanging. Workers end themselves when this process ends.
"""

import logging
import os
import socket
import subprocess
import sys
import weakref
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from gpu.batch import Batch, StepResult, TokenMask
from gpu.batch_wire import encode, encode_mask
from gpu.config import RunnerConfig
from gpu.distributed import host_store
from gpu.kv_cache_groups import KVCacheGroup
from gpu.runner import run_step
from gpu.tensor_parallel_worker import WorkerStart

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 1800.0  # loading a large checkpoint and capturing CUDA graphs
STEP_TIMEOUT_S = 300.0  # a step's first run may compile kernels; none takes minutes
COLLECTIVE_TIMEOUT_S = 600.0  # a collective waiting longer for a peer fails (covers uneven loading times)
_STOP_TIMEOUT_S = 10.0
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


class _Worker:
    def __init__(self, rank: int) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_PROJECT_ROOT),
                                                                          os.environ.get("PYTHONPATH")]))}
        self.rank = rank
        self.process = subprocess.Popen([sys.executable, "-m", "gpu.tensor_parallel_worker", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.connection = Connection(ours.detach())

    def describe_exit(self) -> str:
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return f"tensor-parallel rank {self.rank} closed its connection"
        return f"tensor-parallel rank {self.rank} exited (exit code {code})"


class RemoteStep:
    """A launched step whose tokens rank 0 will send (the tensor-parallel PendingStep)."""

    sampled_token_ids = None  # they stay on the workers' devices

    def __init__(self, runner: "TensorParallelRunner", index: int) -> None:
        self._runner = runner
        self._index = index

    def result(self) -> StepResult:
        return self._runner.result_of(self._index)


class RemoteLogits:
    """A launched step whose sampling on rank 0 waits for its token masks (`sample_masked`)."""

    def __init__(self, step: RemoteStep) -> None:
        self.step = step


class TensorParallelRunner:
    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.size = config.tensor_parallel_size
        device_type = _device_type(config.device, self.size)
        self._store = host_store(COLLECTIVE_TIMEOUT_S)
        self._workers = [_Worker(rank) for rank in range(self.size)]
        self._finalizer = weakref.finalize(self, _stop, self._workers)
        self._failure: str | None = None
        log_level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        for worker in self._workers:
            self._send(worker, WorkerStart(config, worker.rank, self.size, self._store.port, COLLECTIVE_TIMEOUT_S,
                                           device_type, log_level))
        self.kv_cache_groups, self.has_cuda_graphs = self._wait_until_ready()
        self._num_launched = 0
        self._num_received = 0
        self._results: dict[int, StepResult] = {}
        logger.info("tensor parallel: %d ranks on %s, KV blocks per group %s on each, CUDA graphs %s", self.size,
                    device_type, [g.num_blocks for g in self.kv_cache_groups], "on" if self.has_cuda_graphs else "off")

    def launch(self, batch: Batch) -> RemoteStep | RemoteLogits:
        """Sends the step to every worker and returns without waiting for it."""
        first, others = encode(batch)
        self._send_bytes(self._workers[0], first)
        for worker in self._workers[1:]:
            self._send_bytes(worker, others)
        step = RemoteStep(self, self._num_launched)
        self._num_launched += 1
        return RemoteLogits(step) if batch.has_token_masks else step

    def sample_masked(self, pending: RemoteLogits, token_mask: TokenMask) -> RemoteStep:
        """Sends rank 0 the masks its launched step waits for."""
        self._send_bytes(self._workers[0], encode_mask(token_mask))
        return pending.step

    def execute(self, batch: Batch, token_mask: TokenMask | None = None) -> StepResult:
        """Runs one step and waits for its tokens on the host."""
        return run_step(self, batch, token_mask)

    def result_of(self, index: int) -> StepResult:
        while index not in self._results:
            (_, *payload), = self._receive("result", [0], STEP_TIMEOUT_S).values()
            self._results[self._num_received] = StepResult(*payload)
            self._num_received += 1
        return self._results.pop(index)

    def close(self) -> None:
        """Stops the workers (killing those that do not exit in time)."""
        self._finalizer()

    def restarted(self) -> "TensorParallelRunner":
        """A runner on new workers, for a restarted engine (these are stopped, or were killed by a failure)."""
        self.close()
        return TensorParallelRunner(self.config)

    def _wait_until_ready(self) -> tuple[tuple[KVCacheGroup, ...], bool]:
        """(KV-cache groups, whether decode steps replay CUDA graphs), the same on every rank."""
        ready = self._receive("ready", [w.rank for w in self._workers], START_TIMEOUT_S)
        if len({message[1:] for message in ready.values()}) != 1:
            self._fail(f"the ranks disagree on their KV blocks or CUDA graphs: {ready}")
        return ready[0][1], ready[0][2]

    def _receive(self, kind: str, ranks: list[int], timeout_s: float) -> dict[int, tuple[Any, ...]]:
        """One message of `kind` from each of `ranks`, watching every worker meanwhile: a worker that exits,
        fails or says anything else, or a wait past the timeout, fails the runner (RuntimeError)."""
        if self._failure is not None:
            raise RuntimeError(self._failure)
        workers = {w.connection: w for w in self._workers}
        messages: dict[int, tuple[Any, ...]] = {}
        while len(messages) < len(ranks):
            ready = wait(list(workers), timeout_s)
            if not ready:
                missing = sorted(set(ranks) - set(messages))
                self._fail(f"no {kind!r} from tensor-parallel rank(s) {missing} within {timeout_s:.0f} s")
            for connection in ready:
                worker = workers[connection]  # type: ignore[index]
                try:
                    message = worker.connection.recv()
                except (EOFError, OSError):
                    self._fail(worker.describe_exit())
                if message[0] == "failed":
                    self._fail(f"tensor-parallel worker failed: {message[1]}")
                if message[0] != kind or worker.rank not in ranks or worker.rank in messages:
                    self._fail(f"tensor-parallel rank {worker.rank} sent {message[0]!r} unasked")
                messages[worker.rank] = message
        return messages

    def _send(self, worker: _Worker, message: object) -> None:
        try:
            worker.connection.send(message)
        except OSError:
            self._fail(worker.describe_exit())

    def _send_bytes(self, worker: _Worker, message: bytes) -> None:
        if self._failure is not None:
            raise RuntimeError(self._failure)
        try:
            worker.connection.send_bytes(message)
        except OSError:
            self._fail(worker.describe_exit())

    def _fail(self, reason: str) -> None:
        """Kills every worker (survivors may wait in a collective for the dead one) and raises."""
        logger.error("tensor parallelism failed: %s", reason)
        self._failure = reason
        _kill(self._workers)
        raise RuntimeError(reason)


def _device_type(device: str, size: int) -> str:
    if device == "cpu":
        return "cpu"
    if device not in ("auto", "cuda"):
        raise ValueError(f"with tensor parallelism the device is auto, cuda or cpu (rank r runs on cuda:r), "
                         f"got {device!r}")
    if not torch.cuda.is_available():
        if device == "cuda":
            raise RuntimeError("device cuda was requested but CUDA is not available")
        return "cpu"
    if torch.cuda.device_count() < size:
        raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs; {torch.cuda.device_count()} are visible")
    return "cuda"


def _stop(workers: list[_Worker]) -> None:
    for worker in workers:
        try:
            worker.connection.send_bytes(b"")
        except OSError:
            pass  # already gone
    for worker in workers:
        try:
            worker.process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("tensor-parallel rank %d did not stop within %.0f s: killing it", worker.rank,
                           _STOP_TIMEOUT_S)
    _kill(workers)


def _kill(workers: list[_Worker]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.kill()
        worker.process.wait()
        worker.connection.close()
