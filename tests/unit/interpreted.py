"""Running a file of kernel cases under Triton's interpreter: in a pytest process that has TRITON_INTERPRET=1 from its
start (Triton's own helpers such as tl.sum stay compiled-only in a process that imported triton first)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def assert_cases_pass_under_the_interpreter(cases: Path) -> None:
    """Every case in `cases` ran and passed (none skipped), in one process without pytest's workers."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "-W", "ignore::RuntimeWarning", str(cases)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
