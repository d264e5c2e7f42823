"""Per-GPU tables of measured launch parameters: the kernels' config modules keep one per GPU name, and a device
takes the table of the first name its own contains ("H100" in "NVIDIA H100 80GB HBM3")."""

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def table_named(tables: Mapping[str, T], device_name: str) -> T | None:
    """The table of the first GPU name contained in `device_name`; None for a GPU without one (the rules decide)."""
    return next((table for name, table in tables.items() if name in device_name), None)
