"""Percentiles and the per-request serving metrics (TTFT, TPOT, ITL), against hand-worked numbers."""

import math
import random

import numpy as np
import pytest

from bench.stats import RequestRecord, percentile, summarize


def test_percentile_interpolates_linearly() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # mean of the middle two, order of input irrelevant
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)  # rank 2.97: 3 + 0.97 * (4 - 3)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0 and percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_percentile_agrees_with_numpy() -> None:
    rng = random.Random(0)
    for n in (2, 3, 10, 101):
        values = [rng.random() for _ in range(n)]
        for q in (1, 50, 90, 99):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_request_metrics_by_hand() -> None:
    # Sent at 10.0; text chunks at 10.1, 10.15, 10.2, 10.3; [DONE] at 10.3; usage says 4 tokens.
    r = RequestRecord(start=10.0, chunk_times=[10.1, 10.15, 10.2, 10.3], end=10.3, num_output_tokens=4)
    assert r.is_ok
    assert r.ttft == pytest.approx(0.1)
    assert r.e2e == pytest.approx(0.3)
    assert r.tpot == pytest.approx((0.3 - 0.1) / 3)
    assert r.itls == pytest.approx([0.05, 0.05, 0.1])


def test_tpot_counts_tokens_not_chunks() -> None:
    # A server that coalesced 8 tokens into 2 chunks: TPOT still divides by tokens - 1.
    r = RequestRecord(start=0.0, chunk_times=[0.5, 1.2], end=1.2, num_output_tokens=8)
    assert r.tpot == pytest.approx(0.7 / 7)
    assert r.itls == pytest.approx([0.7])


def test_a_single_token_request_has_no_tpot() -> None:
    assert RequestRecord(start=0.0, chunk_times=[0.2], end=0.2, num_output_tokens=1).tpot is None


def test_summarize_excludes_failed_requests_from_rates_and_percentiles() -> None:
    ok = [RequestRecord(start=0.0, chunk_times=[0.1 * (i + 1), 0.1 * (i + 1) + 0.2], end=0.1 * (i + 1) + 0.2,
                        num_output_tokens=3) for i in range(4)]
    failed = [RequestRecord(start=0.0, error="HTTP 500: boom"), RequestRecord(start=0.0, chunk_times=[5.0])]
    s = summarize(16, ok + failed, duration_s=2.0)
    assert (s["concurrency"], s["num_requests"], s["num_failed"]) == (16, 6, 2)
    assert s["num_output_tokens"] == 12
    assert s["output_tokens_per_s"] == 6.0 and s["request_per_s"] == 2.0
    assert s["ttft_ms"]["p50"] == pytest.approx(250.0)  # TTFTs 100, 200, 300, 400 ms
    assert s["tpot_ms"]["p50"] == pytest.approx(100.0) and s["tpot_ms"]["p99"] == pytest.approx(100.0)  # 0.2 s / 2
    assert s["itl_ms"]["p50"] == pytest.approx(200.0)
    assert s["itl_ms"]["max"] == pytest.approx(200.0)  # not the failed stream's
    assert s["e2e_ms"]["p50"] == pytest.approx(450.0)


def test_the_longest_pause_is_the_longest_gap_of_any_stream() -> None:
    steady = RequestRecord(start=0.0, chunk_times=[0.1, 0.2, 0.3], end=0.3, num_output_tokens=3)
    held = RequestRecord(start=0.0, chunk_times=[0.1, 0.75, 0.8], end=0.8, num_output_tokens=3)
    s = summarize(2, [steady, held], duration_s=1.0)
    assert s["itl_ms"]["max"] == pytest.approx(650.0)
    assert s["itl_ms"]["p50"] == pytest.approx(100.0)
