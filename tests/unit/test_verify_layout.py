"""gpu/kernels/verify_layout.py against gpu/device_verification.py's torch functions under Triton's interpreter (the
cases of tests/unit/verify_layout_interpreted_cases.py, in a process that has TRITON_INTERPRET=1 from its start);
tests/gpu/test_verify_layout_gpu.py runs the compiled kernels, in a CUDA graph too."""

from pathlib import Path

import pytest

from tests.unit.interpreted import assert_cases_pass_under_the_interpreter

pytest.importorskip("triton")


def test_layout_and_acceptance_equal_the_torch_functions_under_the_interpreter() -> None:
    assert_cases_pass_under_the_interpreter(Path(__file__).with_name("verify_layout_interpreted_cases.py"))
