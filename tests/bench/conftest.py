from pathlib import Path

import pytest
import torch

from bench.bench_model import SHAPES, build_random_checkpoint


@pytest.fixture
def tiny_bench_model(tmp_path: Path) -> Path:
    """The `tiny` shape in float32, random weights: its vocabulary covers the workloads' prompt ids."""
    return build_random_checkpoint(tmp_path / "model", SHAPES["tiny"], torch.float32)
