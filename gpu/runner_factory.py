"""The runner an engine gets: the model in this process, or one worker process per tensor-parallel rank."""

from gpu.config import RunnerConfig
from gpu.model_runner import ModelRunner
from gpu.tensor_parallel_runner import TensorParallelRunner

Runner = ModelRunner | TensorParallelRunner


def make_runner(config: RunnerConfig) -> Runner:
    if config.tensor_parallel_size == 1:
        return ModelRunner(config)
    return TensorParallelRunner(config)
