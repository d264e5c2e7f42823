"""gpu/kernels/f16x2.py's pure-Triton twins (what the interpreted kernels run in place of its PTX) under Triton's
interpreter, against a numpy model of that PTX: the cases of tests/unit/f16x2_interpreted_cases.py, run by pytest in a
process that has TRITON_INTERPRET=1 from its start."""

from pathlib import Path

import pytest

from tests.unit.interpreted import assert_cases_pass_under_the_interpreter

pytest.importorskip("triton")

CASES = Path(__file__).with_name("f16x2_interpreted_cases.py")


def test_f16x2_twins_under_the_interpreter() -> None:
    assert_cases_pass_under_the_interpreter(CASES)
