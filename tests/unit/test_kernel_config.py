"""The runner's kernel choices (gpu.config.KernelConfig) reach every layer and the sampler it builds: a choice
is made once, when the runner is built, and A/B runs build one runner per choice instead of flipping a live one."""

from dataclasses import fields, replace
from pathlib import Path

from core.config import engine_config
from core.engine import runner_config
from gpu.config import KernelConfig
from gpu.model_runner import ModelRunner


def test_every_layer_and_the_sampler_get_the_runners_kernel_choice(tiny_qwen3_dir: Path) -> None:
    switches = {f.name: not f.default for f in fields(KernelConfig) if f.type is bool}  # every switch off its default
    kernels = KernelConfig(**switches, cpu_march="haswell")  # AVX2 code, which this x86 test machine runs
    config = runner_config(engine_config(str(tiny_qwen3_dir), device="cpu", kv_cache_blocks=8))
    runner = ModelRunner(replace(config, kernels=kernels))
    chosen = [module for module in runner.model.modules() if hasattr(module, "kernels")]
    assert {type(module).__name__ for module in chosen} == {
        "DecoderAttention", "MergedLinear", "RowParallelLinear", "RMSNorm", "SiluAndMul",  # o/down: row-parallel
        "ParallelLMHead"}
    assert all(module.kernels is kernels for module in chosen)
    assert runner.sampler.kernels is kernels
