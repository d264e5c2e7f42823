"""Where quack's gated GEMM may run (gpu/kernels/gated_gemm.py), on a machine without CUDA: nowhere. Its GPU behaviour
is tests/gpu/test_gated_gemm.py's."""

import torch

from gpu.kernels import gated_gemm
from gpu.layers.linear import MergedLinear


def test_off_a_gpu_it_is_unavailable() -> None:
    cpu = torch.device("cpu")
    assert gated_gemm.unavailable_reason(cpu, torch.bfloat16) == "it needs CUDA (device cpu)"
    assert not gated_gemm.is_ready(cpu, torch.bfloat16)


def test_a_cpu_layer_never_takes_it() -> None:
    layer = MergedLinear(64, {"gate": 128, "up": 128}, False).to(torch.bfloat16)
    assert not layer.fuses_silu_and_mul(torch.zeros(gated_gemm.MIN_ROWS, 64, dtype=torch.bfloat16))


def test_a_cutlass_dsl_outside_site_packages_is_named_in_the_reason() -> None:
    outside = "/tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py"
    hint = gated_gemm.install_hint(outside)
    assert hint is not None and "(/tmp/site/nvidia_cutlass_dsl/dsl_packages)" in hint and "site-packages" in hint
    for inside in ("/opt/venv/lib/python3.12/site-packages/nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py",
                   "/usr/lib/python3/dist-packages/nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py"):
        assert gated_gemm.install_hint(inside) is None
    assert gated_gemm.install_hint(None) is None  # not installed: nothing to move
