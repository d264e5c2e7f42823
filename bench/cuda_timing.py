"""Timing on a CUDA device for the kernel benchmarks: medians of many calls, and calls replayed from a graph.

`median_ms` is triton's `do_bench` (the L2 cache flushed between calls, median of the samples). `graph_ms`
captures `calls` calls in one CUDA graph and times its replays, as a decode step replays its kernels: launch
overhead then counts as it does in the engine, not once per eager call.
"""

from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], rep_ms: int = 200) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def graph_ms(fn: Callable[[], object], calls: int) -> float:
    """Milliseconds per call, from replays of a graph holding `calls` calls (compiled on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return median_ms(graph.replay) / calls
