"""gpu/kernels/verify_layout.py under Triton's interpreter on the CPU: a verifying step's layout and acceptance equal
gpu/device_verification.py's torch functions on random steps (tests/unit/verify_layout_cases.py). Run by
tests/unit/test_verify_layout.py in a process that has TRITON_INTERPRET=1 from its start."""

import os
import random

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from tests.unit.verify_layout_cases import check_random_steps  # noqa: E402


def test_random_steps_lay_out_and_accept_as_the_torch_functions() -> None:
    check_random_steps(random.Random(0), torch.device("cpu"), 60)
