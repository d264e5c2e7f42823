"""Distances between floats in units in the last place, for kernel tests that allow a rounding's difference."""

import torch

INT_TYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def ulps(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How many representable values of their dtype lie between got and expected (same-sign finite values)."""
    int_type = INT_TYPES[got.dtype]
    return (got.view(int_type).long() - expected.view(int_type).long()).abs()
