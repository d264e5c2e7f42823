"""Tensor parallelism for the MoE families on CPU: TP=2 (two gloo worker processes, each holding half of every
expert's intermediate rows and one all-reduce after each MoE block) gives exactly TP=1's float32 greedy tokens,
which are transformers', through chunked prefill, preemption and prefix-cache hits. One TP=2 engine per model
serves its cases, as in tests/parity/test_tensor_parallel_cpu.py."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.moe_models import build_moe_model
from tests.parity.tensor_parallel_cases import (
    Engines,
    check_a_batch_that_is_chunked_and_preempted,
    check_shared_prefixes_hit,
    engines_of,
)

MODELS = ("qwen3_moe", "mixtral", "glm4_moe", "gpt_oss")


@pytest.fixture(scope="module", params=MODELS)
def engines(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    model_dir = build_moe_model(tmp_path_factory.mktemp(request.param), request.param, tiny_model_dirs["qwen3"])
    yield from engines_of(model_dir)


def test_a_batch_that_is_chunked_and_preempted(engines: Engines) -> None:
    check_a_batch_that_is_chunked_and_preempted(engines)


def test_shared_prefixes_hit_the_prefix_cache(engines: Engines) -> None:
    check_shared_prefixes_hit(engines)
