"""Triton kernels, one kernel (or one kernel pair) per file, each with a thin wrapper that checks
shapes, strides and dtypes before launching. Importing any module here needs `triton`; nothing
outside `gpu.attention.triton_backend` and the GPU tests imports them.
"""
