"""The benchmarks' runners are given to the engine by the interface it drives (gpu.runner.Runner),
as the real ones are (tests/parity/test_tensor_parallel_cpu.py checks ModelRunner and TensorParallelRunner)."""

from bench.engine_runs import TimedRunner
from bench.server_overhead import EmulatedRunner
from gpu.runner import Runner


def test_the_emulated_and_the_timed_runner_are_runners() -> None:
    emulated = EmulatedRunner(num_kv_blocks=8, vocab_size=100, step_s=0.0)
    assert isinstance(emulated, Runner) and isinstance(TimedRunner(emulated), Runner)
