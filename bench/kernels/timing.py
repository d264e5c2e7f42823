"""What the kernel benchmarks share: a call's time as the median replay of a CUDA graph of many calls, the calls
rotating over copies of their weights that together outgrow the L2 (256 MB, five times an H100's 50 MB), so the
weights come from HBM as they do in a decode step."""

import math
from collections.abc import Callable
from functools import partial

import torch

from bench.roofline import median_seconds

ROTATION_BYTES = 256 << 20
MIN_CALLS_PER_GRAPH = 32
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")


def num_copies(bytes_per_copy: int) -> int:
    """How many copies of an operand of `bytes_per_copy` bytes fill the rotation (two at least)."""
    return max(2, math.ceil(ROTATION_BYTES / bytes_per_copy))


def graph_us_per_call(calls: list[Callable[[], object]], replays: int = 7) -> float:
    """Microseconds per call: the median replay of one CUDA graph of `calls`, each run once before (compiles)."""
    for call in calls:
        call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # which synchronizes the device first
        for call in calls:
            call()
    return median_seconds(graph.replay, DEVICE, repeats=replays) * 1e6 / len(calls)


def rotated_us_per_call(fn: Callable[[torch.Tensor, object], object], x: torch.Tensor, operands: list) -> float:
    """Microseconds per `fn(x, operand)`, the graph's calls rotating over `operands`."""
    rotation = operands * max(1, math.ceil(MIN_CALLS_PER_GRAPH / len(operands)))
    return graph_us_per_call([partial(fn, x, operand) for operand in rotation])
