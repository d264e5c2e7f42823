"""The row buckets cuBLAS products run at on a GPU (gpu/kernels/cublas_rows.py): the rule's shape, and the padded
product against the unpadded one, on CPU tensors (the padding itself is device-agnostic; only the choice to pad is
CUDA's)."""

import pytest
import torch
import torch.nn.functional as F

from gpu.kernels.cublas_rows import (
    EXACT_ROWS,
    cublas_row_bucket,
    cublas_row_buckets,
    linear_at_rows,
    pad_rows,
    padded_linear,
    rows_to_run,
)
from gpu.mixed_graphs import token_buckets


def test_rows_up_to_64_run_exactly() -> None:
    assert [cublas_row_bucket(m) for m in range(1, EXACT_ROWS + 1)] == list(range(1, EXACT_ROWS + 1))
    assert cublas_row_bucket(65) == 128


def test_buckets_are_monotonic_fixed_points_that_pad_little() -> None:
    previous = 0
    for m in range(1, 20_001):
        bucket = cublas_row_bucket(m)
        assert previous <= bucket and m <= bucket, m
        assert cublas_row_bucket(bucket) == bucket, m  # a bucket's rows run as they are
        assert bucket - m < 64 if m <= 2048 else (bucket - m) * 16 < m, m  # past 1024 rows: under a sixteenth
        previous = bucket


def test_the_buckets_spacing() -> None:
    buckets = cublas_row_buckets(8192)
    assert len(buckets) == 63
    assert buckets == sorted({cublas_row_bucket(m) for m in range(EXACT_ROWS + 1, 8193)})
    assert buckets[:3] == [128, 192, 256] and buckets[30:33] == [2048, 2176, 2304] and buckets[-2:] == [7936, 8192]
    assert cublas_row_buckets(5000)[-1] == 5120  # the bucket that holds the most rows, past max_rows
    assert cublas_row_buckets(64) == [] and cublas_row_buckets(65) == [128]


def test_the_mixed_graphs_token_buckets_are_row_buckets() -> None:
    """So a step with prefill runs its products at the same rows in a graph (captured unpadded) and eagerly."""
    assert all(cublas_row_bucket(b) == b for b in token_buckets(16384))


def test_a_cpu_product_runs_at_its_own_rows() -> None:
    assert rows_to_run(1000, torch.device("cpu")) == 1000
    x, weight = torch.randn(1000, 32), torch.randn(48, 32)
    assert torch.equal(padded_linear(x, weight, None), F.linear(x, weight, None))


def test_pad_rows_appends_zero_rows() -> None:
    x = torch.randn(70, 16)[:, ::2]  # not contiguous
    padded = pad_rows(x, 128)
    assert padded.shape == (128, 8) and padded.is_contiguous()
    assert torch.equal(padded[:70], x) and not padded[70:].any()


@pytest.mark.parametrize("shape", [(65, 96), (100, 96), (2049, 96), (3, 700, 96)])
@pytest.mark.parametrize("has_bias", [False, True])
def test_the_padded_product_is_the_products_rows(shape: tuple[int, ...], has_bias: bool) -> None:
    """The GPU's padded product, on CPU tensors: the same values and shape as F.linear, contiguous."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    weight = torch.randn(40, 96, generator=generator, dtype=torch.float64)
    bias = torch.randn(40, generator=generator, dtype=torch.float64) if has_bias else None
    num_rows = cublas_row_bucket(x.numel() // 96)
    assert num_rows > x.numel() // 96
    y = linear_at_rows(x, weight, bias, num_rows)
    assert y.shape == (*shape[:-1], 40) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-12, atol=1e-12)
