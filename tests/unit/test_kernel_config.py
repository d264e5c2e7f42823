"""The runner's kernel choices (gpu.config.KernelConfig) reach every layer and the sampler it builds: a choice
is made once, when the runner is built, and A/B runs build one runner per choice instead of flipping a live one."""

from dataclasses import fields
from pathlib import Path

from gpu.config import KernelConfig, RunnerConfig
from gpu.model_runner import ModelRunner


def test_every_layer_and_the_sampler_get_the_runners_kernel_choice(tiny_qwen3_dir: Path) -> None:
    kernels = KernelConfig(**{f.name: not f.default for f in fields(KernelConfig)})  # every choice off its default
    runner = ModelRunner(RunnerConfig(model_path=str(tiny_qwen3_dir), device="cpu", num_kv_blocks=8, kernels=kernels))
    chosen = [module for module in runner.model.modules() if hasattr(module, "kernels")]
    assert {type(module).__name__ for module in chosen} == {
        "DecoderAttention", "MergedLinear", "Linear", "RMSNorm", "SiluAndMul"}
    assert all(module.kernels is kernels for module in chosen)
    assert runner.sampler.kernels is kernels
