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


# Torch's own math, function by function, for kernels that must round as the torch code they replace: compiled, the
# libdevice function torch's CUDA kernel calls; under the interpreter (tests on the CPU, against torch's CPU code) what
# numpy has nearest to it.


@triton.jit
def exp(x):
    """libdevice's expf when compiled (torch's CUDA exp; tl.exp is a faster approximation); numpy's exp under the
    interpreter, which can differ from torch's CPU exp by an ulp or two."""
    if IS_INTERPRETED:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def log1p(x):
    """libdevice's log1pf when compiled (torch's CUDA log1p); under the interpreter, which has no log1p, log(1 + x) in
    float64 rounded to float32 (correctly rounded but for rare double roundings; torch's CPU log1p is within an ulp)."""
    if IS_INTERPRETED:
        return tl.log(1.0 + x.to(tl.float64)).to(tl.float32)
    else:
        return libdevice.log1p(x)


@triton.jit
def rsqrt(x):
    """libdevice's rsqrtf when compiled: torch's CUDA rsqrt calls it (the hardware approximation, within 2 ulp of the
    true value, not 1 / sqrt); under the interpreter 1 / sqrt, each rounded, as torch's CPU rsqrt computes it."""
    if IS_INTERPRETED:
        return tl.math.div_rn(1.0, tl.sqrt_rn(x))
    else:
        return libdevice.rsqrt(x)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """float32 x rounded to the nearest `dtype` value, ties to even, as torch's `.to(dtype)`: the compiled cast does
    so; the interpreter's float32 -> bfloat16 cast truncates, so there the bits are rounded first (finite x)."""
    if IS_INTERPRETED:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True).to(dtype)
        else:
            return x.to(dtype)
    else:
        return x.to(dtype)
