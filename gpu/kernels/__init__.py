"""Triton kernels, one kernel (or one kernel pair) per file, each with a thin wrapper that checks
shapes, strides and dtypes before launching. Importing any module here needs `triton`; nothing
outside `gpu.attention.triton_backend` and the GPU tests imports them at start-up: layers import
them on their first CUDA call, where `HAS_TRITON` says they can. One file wraps another library's
kernel instead: gated_gemm.py, quack's gated GEMM (needs quack, checked where it is used).
"""

import importlib.util

HAS_TRITON = importlib.util.find_spec("triton") is not None  # this package itself imports without triton
