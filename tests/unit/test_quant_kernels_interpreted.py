"""The quantized GEMM kernels (gpu/kernels/int_gemm.py, gguf_gemm.py, fp8_gemm.py) run by Triton's interpreter on
the CPU against their formats' reference dequantization: indexing, unpacking, group and block scales, split-K,
rows and columns past the tiles' edges. float16 activations (the interpreter's bfloat16 dot is not numpy's;
tests/gpu/test_quant_kernels.py checks bf16 on CUDA)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from gpu.quant import gguf_blocks
from gpu.quant.int_weights import IntGroups, pack_columns

pytest.importorskip("triton")

KERNELS = Path(__file__).resolve().parents[2] / "gpu" / "kernels"


def interpreted(name: str) -> ModuleType:
    """gpu/kernels/<name>.py loaded afresh with TRITON_INTERPRET=1, with the kernels it imports loaded likewise."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.startswith("gpu.kernels.")}
        try:
            spec = importlib.util.spec_from_file_location(f"{name}_interpreted", KERNELS / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            for m in [m for m in sys.modules if m.startswith("gpu.kernels.")]:
                del sys.modules[m]
            sys.modules.update(saved)
    return module


@pytest.fixture(scope="module")
def int_kernel() -> ModuleType:
    return interpreted("int_gemm")


@pytest.fixture(scope="module")
def gguf_kernel() -> ModuleType:
    return interpreted("gguf_gemm")


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * (ref.abs().max().item() + 1))


@pytest.mark.parametrize(("bits", "group_size", "has_zeros", "has_group_ids", "m", "n", "k"), [
    (4, 128, False, False, 3, 40, 256), (4, 32, True, False, 17, 24, 512), (8, 64, True, True, 2, 16, 128),
    (4, 128, True, True, 1, 8, 1024)])
def test_int_gemm_equals_the_dequantized_product(int_kernel: ModuleType, bits: int, group_size: int,
                                                 has_zeros: bool, has_group_ids: bool, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(bits * n + k)
    groups = k // group_size
    stored = IntGroups(bits, torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int32),
                       (torch.rand(n, groups, generator=g) * 0.02 + 0.001).half(),
                       torch.randint(0, 1 << bits, (n, groups), generator=g).half() if has_zeros else None,
                       (torch.randperm(k, generator=g) // group_size).to(torch.int32) if has_group_ids else None)
    x = torch.randn(m, k, generator=g).half()
    out = int_kernel.int_gemm(x, pack_columns(stored.levels, bits), stored.scales, stored.zeros, stored.group_ids,
                              bits)
    _close(out, x.float() @ stored.dequantize().T)


@pytest.mark.parametrize("kind", gguf_blocks.TYPES)
def test_gguf_gemm_equals_the_dequantized_product(gguf_kernel: ModuleType, kind: str) -> None:
    import gguf

    from tests.quant_checkpoints import random_gguf_blocks

    m, n, k = 5, 20, 512
    blocks = torch.from_numpy(np.ascontiguousarray(random_gguf_blocks(n, k, getattr(gguf.GGMLQuantizationType, kind),
                                                                      seed=len(kind))))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).half()
    bias = torch.randn(n).half()
    out = gguf_kernel.gguf_gemm(x, blocks, kind, bias)
    _close(out, x.float() @ gguf_blocks.dequantize(blocks, kind).T + bias.float())
