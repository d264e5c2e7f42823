"""Per-GPU tables of measured launch parameters: the kernels' config modules keep one per GPU name, and a device
takes the table of the first name its own contains ("H100" in "NVIDIA H100 80GB HBM3")."""

import functools
from collections.abc import Mapping
from typing import TypeVar

import torch

T = TypeVar("T")


def table_named(tables: Mapping[str, T], device_name: str) -> T | None:
    """The table of the first GPU name contained in `device_name`; None for a GPU without one (the rules decide)."""
    return next((table for name, table in tables.items() if name in device_name), None)


def device_name(device: torch.device) -> str:
    """The GPU's name (the tables' key), looked up once per device; empty off CUDA (Triton's interpreter)."""
    if device.type != "cuda":
        return ""
    return _name_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _name_of(index: int) -> str:
    return torch.cuda.get_device_name(index)
