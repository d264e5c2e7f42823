"""What an engine drives (`Runner`): ModelRunner, TensorParallelRunner, or a test's stand-in (one that fails on
purpose, say), each passed in by this interface.

A runner launches a step and returns at once (`StepInFlight`); a batch with token masks returns what waits
for them instead, which `sample_masked` turns into a step in flight once the masks are filled.
"""

from typing import Any, Protocol, TypeVar, runtime_checkable

from gpu.batch import Batch, StepResult, TokenMask
from gpu.kv_cache_groups import KVCacheGroup

Awaiting = TypeVar("Awaiting")  # one runner's kind of AwaitingMasks


@runtime_checkable
class StepInFlight(Protocol):
    """A launched step (PendingStep, RemoteStep): `result()` waits for its tokens on the host."""

    def result(self) -> StepResult: ...


@runtime_checkable
class Runner(Protocol[Awaiting]):
    """What an engine drives. `launch` queues a step and returns at once; a batch with token masks returns
    what waits for them, which the engine hands to `sample_masked` once it has filled them."""

    kv_cache_groups: tuple[KVCacheGroup, ...]  # the layers' KV-cache groups and their blocks (gpu/kv_cache_groups.py)

    def launch(self, batch: Batch) -> StepInFlight | Awaiting: ...

    def sample_masked(self, pending: Awaiting, token_mask: TokenMask) -> StepInFlight: ...

    def close(self) -> None: ...

    def restarted(self) -> "Runner[Awaiting]":
        """The runner a restarted engine drives."""
        ...


def run_step(runner: Runner[Any], batch: Batch, token_mask: TokenMask | None = None) -> StepResult:
    """Runs one step and waits for its tokens on the host (warm-up, tests and benchmarks; the engine
    launches the next step before it waits)."""
    pending = runner.launch(batch)
    if not isinstance(pending, StepInFlight):  # it waits for its token masks
        assert token_mask is not None, "the batch has token masks: pass them"
        pending = runner.sample_masked(pending, token_mask)
    return pending.result()
