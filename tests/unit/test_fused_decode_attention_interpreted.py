"""The fused decode attention (gpu/kernels/fused_decode_attention.py) under Triton's interpreter, bit for bit against
qk_norm_rope_store_kv then decode_attention: the cases of tests/unit/fused_decode_attention_interpreted_cases.py, run
by pytest in a process that has TRITON_INTERPRET=1 from its start."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("fused_decode_attention_interpreted_cases.py")


@pytest.mark.long
def test_fused_decode_attention_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "-W", "ignore::RuntimeWarning", str(CASES)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
