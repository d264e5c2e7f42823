"""Tests marked `alone` (they measure time or CPU load) run with no other test beside them when the suite runs in
parallel (pytest-xdist's workers): every test holds one lock file of the run, shared, from its setup to its
teardown (module fixtures included: they start in a module's first test and stop in its last), and an `alone` one
holds it exclusively.

A test asks for the lock through a gate, which one waiting for the exclusive hold keeps while it waits: no new
test starts beside it, so it waits for the tests running now, never for the rest of the suite.
"""

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MARKER = "alone"


def lock_dir(run_id: str) -> Path:
    """The directory of the run's lock files, which every worker of the run (`run_id`) finds."""
    return Path(tempfile.gettempdir()) / f"openai-serve-tests-{run_id}"


@contextmanager
def turn(directory: Path, is_alone: bool) -> Iterator[None]:
    """Held while a test runs: shared, or exclusive when `is_alone`."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "gate", "a") as gate, open(directory / "tests", "a") as tests:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if is_alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the file releases its lock
