"""The reliability suite: bad input, fuzzed bodies, disconnect chaos, a killed engine, big
bodies, slow and silent clients, each against a real server on the tiny model.

One server serves the bad-input corpus, the fuzzing and the HTTP-level cases (package scope); the
modules that need their own (an engine process to kill, short timeouts, a separate process whose
event loop and memory are measured) start it themselves. With RELIABILITY_FIGURES=path the
figures the suite measures (cases tried and held, the worst event-loop stall, memory growth) are
written there as JSON, for docs/reliability.md.
"""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.tiny_model import build_tiny_model
from tests.e2e.serving import RunningServer, server_config, start_server

FIGURES: dict[str, object] = {}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("reliability-model"))


@pytest.fixture(scope="package")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, server_config(api_key="sk-reliability"))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def figures() -> Iterator[dict[str, object]]:
    """What the suite measured, by test; written to $RELIABILITY_FIGURES at the end of the session."""
    yield FIGURES
    path = os.environ.get("RELIABILITY_FIGURES")
    if path and FIGURES:
        Path(path).write_text(json.dumps(FIGURES, indent=1, sort_keys=True) + "\n")
