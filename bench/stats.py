"""Serving metrics from per-request timings, defined as vLLM's benchmark_serving defines them.

- TTFT: from sending the request to the first chunk that carries text.
- TPOT, per request: (E2E - TTFT) / (output tokens - 1); a request with one token has none.
- ITL: the gaps between consecutive text chunks of a request, pooled over all requests (a chunk of several tokens is
  one gap, as a user sees it).
- Percentiles interpolate linearly between order statistics (numpy's default).
"""

import math
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """What the client saw of one request; times in seconds on the client's monotonic clock."""

    start: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text
    end: float | None = None
    num_output_tokens: int = 0  # from the usage chunk when the server sends one, else the text chunks
    error: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.error is None and self.end is not None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start

    @property
    def e2e(self) -> float:
        assert self.end is not None
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        return None if self.num_output_tokens < 2 else (self.e2e - self.ttft) / (self.num_output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), min(math.floor(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms_percentiles(values: list[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds."""
    return {f"p{q}": round(percentile(values, q) * 1e3, 3) for q in (50, 99)}


def summarize(concurrency: int, records: list[RequestRecord], duration_s: float) -> dict[str, object]:
    """One concurrency level's figures; rates count successful requests only, over the level's wall time."""
    ok = [r for r in records if r.is_ok]
    num_tokens = sum(r.num_output_tokens for r in ok)
    itls = [gap for r in ok for gap in r.itls]
    return {"concurrency": concurrency, "num_requests": len(records), "num_failed": len(records) - len(ok),
            "duration_s": round(duration_s, 3), "request_per_s": round(len(ok) / duration_s, 3),
            "output_tokens_per_s": round(num_tokens / duration_s, 1), "num_output_tokens": num_tokens,
            "ttft_ms": ms_percentiles([r.ttft for r in ok]),
            "tpot_ms": ms_percentiles([t for r in ok if (t := r.tpot) is not None]),
            # With "max": the longest pause any stream saw (what a scheduler that holds streams back costs them).
            "itl_ms": {**ms_percentiles(itls), "max": round(max(itls, default=math.nan) * 1e3, 3)},
            "e2e_ms": ms_percentiles([r.e2e for r in ok])}
