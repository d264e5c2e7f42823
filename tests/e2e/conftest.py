"""End-to-end fixtures. Each test module starts ONE server (module scope) so the suite stays fast
on two CPU cores; see serving.py for what a server is.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.tiny_model import build_tiny_model
from tests.e2e.serving import RunningServer, start_server


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("e2e-model"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def ending(model_dir: Path) -> dict[str, object]:
    """Sampling fields (extra_body) that make the tiny model's answer end by itself (finish `stop`): 4
    tokens, then its end-of-text token."""
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    return {"min_tokens": 4, "logit_bias": {str(eos): 100}}
