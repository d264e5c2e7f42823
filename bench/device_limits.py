"""The two ceilings of the device, measured in the same run as the figures they judge.

Copy bandwidth: a large device-to-device copy, counting bytes read plus bytes written. Matmul
rate: a large square matrix product in the model's dtype. Both on random data (zeros can run
faster), timed with CUDA events after warm-up, median of several repeats. On a CPU the same is
timed with the wall clock on smaller sizes; those figures only make the CPU smoke runs complete.
"""

import statistics
import time
from collections.abc import Callable

import torch

from bench.roofline import DeviceLimits


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_copy_bytes_per_s(device: torch.device, num_bytes: int, repeats: int = 20) -> float:
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, repeats)
    return 2 * num_bytes / seconds


def measure_matmul_flops_per_s(device: torch.device, n: int, dtype: torch.dtype, repeats: int = 20) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = _median_seconds(lambda: a @ b, device, repeats)
    return 2 * n**3 / seconds


def measure_limits(device: torch.device, dtype: torch.dtype) -> DeviceLimits:
    is_cuda = device.type == "cuda"
    limits = DeviceLimits(
        copy_bytes_per_s=measure_copy_bytes_per_s(device, (2 << 30) if is_cuda else (16 << 20)),
        matmul_flops_per_s=measure_matmul_flops_per_s(device, 8192 if is_cuda else 256, dtype),
    )
    if is_cuda:
        torch.cuda.empty_cache()  # give the engine the memory back before it sizes its KV cache
    return limits
