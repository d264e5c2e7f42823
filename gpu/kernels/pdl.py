"""Programmatic dependent launch (PDL, Hopper and newer) for the kernels of a decode step.

A step at a few rows is a chain of hundreds of short kernels in one CUDA graph, and each boundary costs
the next kernel's launch and ramp while the device idles. Launched as a programmatic
dependent launch, a kernel may start as soon as every program of the one before has executed
`griddepcontrol.launch_dependents`; it then executes `griddepcontrol.wait`, which returns once that
kernel has completed and its memory writes are visible. Every kernel here calls `pdl_start` first, so it
reads and writes nothing before its predecessor is done (no read-after-write nor write-after-read
hazard: only the launch overlaps), and releases its own successor at once. A kernel launched without
PDL, or after one that never releases (cuBLAS, torch), simply starts when its predecessor ends.
"""

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def pdl_start(USE_PDL: tl.constexpr):
    """First statement of a kernel that may be launched with PDL: wait for the predecessor, release the successor."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _supports_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def uses_pdl(wanted: bool, t: torch.Tensor) -> bool:
    """Whether a kernel over `t` is launched with PDL: asked for, on a CUDA device that has it."""
    if not (wanted and t.is_cuda):
        return False
    return _supports_pdl(t.device.index if t.device.index is not None else torch.cuda.current_device())
