"""The runner an engine gets: the model in this process, or one worker process per tensor-parallel rank.

`Runner` is what the engine relies on, so that a benchmark's runner (bench/: one that times the real
one, one that emulates a device) is passed in by its interface, as ModelRunner and TensorParallelRunner are.
"""

from typing import Protocol, TypeVar, runtime_checkable

from gpu.batch import Batch, StepResult, TokenMask
from gpu.config import RunnerConfig
from gpu.model_runner import ModelRunner
from gpu.pending_step import PendingLogits
from gpu.tensor_parallel_runner import RemoteLogits, TensorParallelRunner

# What `launch` returns for a batch with token masks: its sampling waits for `sample_masked`.
AwaitingMasks = PendingLogits | RemoteLogits
Awaiting = TypeVar("Awaiting")  # one runner's kind of AwaitingMasks


@runtime_checkable
class StepInFlight(Protocol):
    """A launched step (PendingStep, RemoteStep): `result()` waits for its tokens on the host."""

    def result(self) -> StepResult: ...


@runtime_checkable
class Runner(Protocol[Awaiting]):
    """What an engine drives. `launch` queues a step and returns at once; a batch with token masks returns
    what waits for them, which the engine hands to `sample_masked` once it has filled them."""

    num_kv_blocks: int

    def launch(self, batch: Batch) -> StepInFlight | Awaiting: ...

    def sample_masked(self, pending: Awaiting, token_mask: TokenMask) -> StepInFlight: ...

    def close(self) -> None: ...

    def restarted(self) -> "Runner[Awaiting]":
        """The runner a restarted engine drives."""
        ...


def make_runner(config: RunnerConfig) -> ModelRunner | TensorParallelRunner:
    if config.tensor_parallel_size == 1:
        return ModelRunner(config)
    return TensorParallelRunner(config)
