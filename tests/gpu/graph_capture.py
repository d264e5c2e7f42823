"""The one way the GPU tests capture a CUDA graph."""

from collections.abc import Callable
from typing import TypeVar

import torch

Outputs = TypeVar("Outputs")


def captured(run: Callable[[], Outputs]) -> tuple[torch.cuda.CUDAGraph, Outputs]:
    """`run` once on a side stream outside any capture (compiles its kernels, settles its allocations), then
    captured: the graph, and the captured call's outputs, its static outputs, which every replay rewrites."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    return graph, outputs
