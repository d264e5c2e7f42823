"""The runner an engine gets: the model in this process, or one worker process per tensor-parallel rank
(both are gpu.runner.Runner)."""

from gpu.config import RunnerConfig
from gpu.model_runner import ModelRunner
from gpu.pending_step import PendingLogits
from gpu.pooling import Pooler
from gpu.pooling_runner import PoolingRunner
from gpu.tensor_parallel_runner import RemoteLogits, TensorParallelRunner

# What `launch` returns for a batch with token masks: its sampling waits for `sample_masked`.
AwaitingMasks = PendingLogits | RemoteLogits


def make_runner(config: RunnerConfig, pooler: Pooler | None = None
                ) -> ModelRunner | TensorParallelRunner | PoolingRunner:
    """`pooler`: a pooling model's (core/pooling_model.py); None: the model generates."""
    if pooler is not None:
        return PoolingRunner(config, pooler)
    if config.tensor_parallel_size == 1:
        return ModelRunner(config)
    return TensorParallelRunner(config)
