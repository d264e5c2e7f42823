"""A process that froze start-up's objects out of the collector's sight (core/startup_gc.py) exits quietly."""

import subprocess
import sys
from pathlib import Path

import pytest

STARTUP_GC = Path(__file__).resolve().parents[2] / "core" / "startup_gc.py"
# The module loaded by its path: the engine and torch need not be imported for this.
FREEZE_AND_EXIT = f"""
import importlib.util
import triton.language  # noqa: F401  (torch imports it through torch._dynamo wherever it is installed)
spec = importlib.util.spec_from_file_location("startup_gc", {str(STARTUP_GC)!r})
startup_gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(startup_gc)
assert startup_gc.freeze_startup_objects() > 0
"""


def test_a_process_that_froze_its_objects_exits_quietly() -> None:
    """Objects still frozen at the interpreter's exit outlive it, and triton's nanobind bindings then print a page of
    'leaked' lines after everything else (after pytest's summary, in a test run whose servers froze them)."""
    pytest.importorskip("triton")
    result = subprocess.run([sys.executable, "-c", FREEZE_AND_EXIT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "leaked" not in result.stderr, result.stderr[-3000:]
