"""Math helpers for Triton kernels that neither tl nor Triton's CPU interpreter offers alike: libdevice's tanh is
compiled-only, and the tests run the kernels under the interpreter."""

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    """1 - 2 / (exp(2x) + 1): exact limits at both ends (exp overflows to inf, or underflows to 0)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
