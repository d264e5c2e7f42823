"""Tensor parallelism for the Gated DeltaNet hybrids on CPU: TP=2 (two gloo worker processes, each holding half of
the linear layers' key and value heads with their states, half of the attention heads and of every expert's rows)
gives exactly TP=1's float32 greedy tokens, which are transformers', through chunked prefill, preemption and prefix
hits that restore state snapshots. One TP=2 engine per model serves its cases, as in
tests/parity/test_tensor_parallel_cpu.py."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hybrid_models import build_hybrid_model
from tests.parity.tensor_parallel_cases import (
    Engines,
    check_a_batch_that_is_chunked_and_preempted,
    check_shared_prefixes_hit,
    engines_of,
)

MODELS = ("qwen3_next", "qwen3_5")


@pytest.fixture(scope="module", params=MODELS)
def engines(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    model_dir = build_hybrid_model(tmp_path_factory.mktemp(request.param), request.param, tiny_model_dirs["qwen3"])
    yield from engines_of(model_dir)


def test_a_batch_that_is_chunked_and_preempted(engines: Engines) -> None:
    check_a_batch_that_is_chunked_and_preempted(engines)


def test_shared_prefixes_resume_from_snapshots(engines: Engines) -> None:
    check_shared_prefixes_hit(engines)
