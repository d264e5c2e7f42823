"""Math helpers for Triton kernels that neither tl nor Triton's CPU interpreter offers alike: libdevice's tanh (the one
torch's CUDA kernels call, so outputs round as torch's do) is compiled-only, the library's reduction combines cannot
be called by an interpreted kernel, and the tests run the kernels under the interpreter too."""

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

IS_INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def tanh(x):
    """libdevice's tanh when compiled; under the interpreter 1 - 2 / (exp(2x) + 1), exact at both limits."""
    if IS_INTERPRETED:
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
    else:
        return libdevice.tanh(x)


@triton.jit
def add(a, b):
    """tl.sum's combine for tl.reduce, as a jit function of ours: Triton's interpreter cannot call the library's own
    when triton was imported before the interpreter was turned on (the interpreted kernel tests)."""
    return a + b


@triton.jit
def maximum(a, b):
    """tl.max's combine for tl.reduce (see `add`)."""
    return tl.maximum(a, b)


@triton.jit
def minimum(a, b):
    """tl.min's combine for tl.reduce (see `add`)."""
    return tl.minimum(a, b)
