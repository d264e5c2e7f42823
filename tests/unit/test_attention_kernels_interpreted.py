"""The attention-side Triton kernels (and the elementwise ones in the newer families' forms, and the MoE ones) under
Triton's interpreter on the CPU: the cases of tests/unit/attention_kernels_interpreted_cases.py,
attention_variant_kernels_interpreted_cases.py, family_kernels_interpreted_cases.py,
gated_attention_kernels_interpreted_cases.py, moe_kernels_interpreted_cases.py,
moe_decode_kernels_interpreted_cases.py, gated_delta_kernels_interpreted_cases.py,
gated_delta_glue_kernels_interpreted_cases.py, causal_conv_rows_interpreted_cases.py and
verify_attention_interpreted_cases.py, run by pytest in one process
that has TRITON_INTERPRET=1 from its start (Triton's own helpers such as tl.sum or tl.cdiv stay compiled-only when
triton was imported first, as it is in this process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
CASES = [Path(__file__).with_name(name) for name in ("attention_kernels_interpreted_cases.py",
                                                     "attention_variant_kernels_interpreted_cases.py",
                                                     "family_kernels_interpreted_cases.py",
                                                     "gated_attention_kernels_interpreted_cases.py",
                                                     "moe_kernels_interpreted_cases.py",
                                                     "moe_decode_kernels_interpreted_cases.py",
                                                     "gated_delta_kernels_interpreted_cases.py",
                                                     "gated_delta_glue_kernels_interpreted_cases.py",
                                                     "causal_conv_rows_interpreted_cases.py",
                                                     "verify_attention_interpreted_cases.py")]


@pytest.mark.long
def test_attention_kernels_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    command = [sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning",
               *map(str, CASES)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
