"""C kernels for the CPU, one kernel family per file, compiled on the machine that runs them at first use
(build.py) and called with tensors' data pointers. Nothing imports them on a GPU.

- int8_dot.c: linear layers on a GGUF grid through integer dot products (gpu/layers/int8_dot_linear.py);
- attention.c: RoPE and the cache write of a step's keys and values, and single-query attention
  (gpu/attention/cpu_backend.py).
"""

from dataclasses import dataclass
from types import ModuleType

import torch

from gpu.cpu_kernels import build

NAMES = ("int8_dot", "attention")
# The activations' dtypes the kernels read and write: float32, or bfloat16 widened to float32 as it is loaded.
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class CpuKernels:
    """The kernels built for this CPU; each None where it could not be (`reasons` says why, for the log)."""

    int8_dot: ModuleType | None = None
    attention: ModuleType | None = None
    reasons: tuple[str, ...] = ()


NO_CPU_KERNELS = CpuKernels()


def load_cpu_kernels(cache_dir: str | None, march: str = "native") -> CpuKernels:
    """Every kernel family, built first for the instruction set `march` (build.load) where this CPU has no cached build
    of it."""
    built = {name: build.load(name, cache_dir, march) for name in NAMES}
    return CpuKernels(**{name: b.module for name, b in built.items()},
                      reasons=tuple(f"{name}: {b.reason}" for name, b in built.items()))
