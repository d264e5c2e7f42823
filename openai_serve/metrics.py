"""/metrics: Prometheus metrics named, typed and bucketed as vLLM's, under the prefix `openai_serve:`.

A dashboard built for vLLM works after replacing `vllm:` with `openai_serve:` (configs/grafana has
one). Every series has a `model_name` label (the first served name). Where the figures come from:
- read from the engine's last stats at each scrape (gauges, and counters that only grow):
  running/waiting requests, KV-cache usage, prefix-cache queries and hits, preemptions, prompt and
  generated tokens; so the server does no work for them between scrapes;
- timed by the engine (core/engine_metrics.py) and handed over once per step by the bridge's
  thread: queue, prefill, decode and inference time, inter-token latency;
- observed here once per finished choice (each engine request; a request with n choices counts
  n, as in vLLM): time to first token and end-to-end latency as the client sees them, prompt and
  generated tokens, the finish reason.

Each app has its own registry (no process-wide global), so servers in one process keep apart.
"""

import bisect
import threading
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from core.engine_metrics import EngineObservations
from core.engine_stats import EngineStats

# No `_created` series beside each counter and histogram, as vLLM: nothing reads them, and they double
# the text of every scrape. (The library's setting is process-wide; this process serves only this.)
disable_created_metrics()

PREFIX = "openai_serve:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    buckets = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class BatchHistogram:
    """A histogram fed many observations of one value at once (`observe(value, count)`), which
    prometheus_client's Histogram cannot do: one step's inter-token latencies are one call."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = list(buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()  # observed on the bridge's thread, collected on the event loop's

    def observe(self, value: float, count: int = 1) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self._bounds, value)] += count
            self._sum += value * count

    def family(self, model_name: str) -> HistogramMetricFamily:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, self._bounds), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model_name"])
        family.add_metric([model_name], buckets, total)
        return family


class _EngineCollector(Collector):
    """Gauges and counters from the engine's last stats, and the histograms the engine times."""

    def __init__(self, metrics: "ServerMetrics") -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        stats, label = m.engine_stats(), [m.model_name]
        gauges = [
            ("num_requests_running", "Number of requests in model execution batches.", stats.num_running),
            ("num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting),
            ("num_requests_in_flight", "Engine requests the server has submitted and not seen finish "
             "(running, waiting, or on their way).", m.num_requests_in_flight()),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage),
            ("num_kv_blocks", "KV-cache blocks in all.", stats.num_total_blocks),
            ("num_kv_blocks_used", "KV-cache blocks referenced by a request.", stats.num_used_blocks),
            ("num_kv_blocks_free", "KV-cache blocks free, holding nothing cached.", stats.num_free_blocks),
            ("num_kv_blocks_evictable", "KV-cache blocks unreferenced but keeping a cached prefix.",
             stats.num_evictable_blocks),
        ]
        for name, doc, value in gauges:
            yield _with_value(GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"]), label, value)
        counters = [
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             stats.num_prefix_cache_queried_tokens),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             stats.num_prefix_cache_hit_tokens),
            ("num_preemptions", "Cumulative number of preemption from the engine.", stats.num_preemptions),
            ("prompt_tokens", "Number of prefill tokens processed.", stats.num_prompt_tokens),
            ("generation_tokens", "Number of generation tokens processed.", stats.num_generation_tokens),
        ]
        if stats.num_spec_accepted_per_position:  # speculative decoding is on
            counters += [
                ("spec_decode_num_drafts", "Number of spec decoding drafts.", stats.num_spec_drafts),
                ("spec_decode_num_draft_tokens", "Number of draft tokens.", stats.num_spec_draft_tokens),
                ("spec_decode_num_accepted_tokens", "Number of accepted tokens.", stats.num_spec_accepted_tokens),
            ]
        for name, doc, value in counters:
            yield _with_value(CounterMetricFamily(PREFIX + name, doc, labels=["model_name"]), label, value)
        if stats.num_spec_accepted_per_position:
            yield _accepted_per_position(m.model_name, stats.num_spec_accepted_per_position)
        for histogram in m.engine_histograms:
            yield histogram.family(m.model_name)


def _accepted_per_position(model_name: str, counts: tuple[int, ...]) -> Metric:
    family = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                 "Accepted tokens per draft's position.", labels=["model_name", "position"])
    for position, count in enumerate(counts):
        family.add_metric([model_name, str(position)], count)
    return family


def _with_value(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float) -> Metric:
    family.add_metric(labels, value)
    return family


class ServerMetrics:
    """The app's registry and every metric in it. `record_engine` from the bridge's thread;
    `observe_choice` and `exposition` from the event loop."""

    def __init__(self, model_name: str, max_model_len: int, engine_stats: Callable[[], EngineStats],
                 num_requests_in_flight: Callable[[], int]) -> None:
        self.model_name = model_name
        self.engine_stats = engine_stats
        self.num_requests_in_flight = num_requests_in_flight
        self.registry = CollectorRegistry()
        self._queue_time, self._prefill_time, self._decode_time, self._inference_time = (
            BatchHistogram(PREFIX + name, doc, REQUEST_LATENCY_BUCKETS) for name, doc in (
                ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
                ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
                ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
                ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
            )
        )
        self._inter_token = BatchHistogram(PREFIX + "inter_token_latency_seconds",
                                           "Histogram of inter-token latency in seconds.", INTER_TOKEN_BUCKETS)
        self.engine_histograms = (self._queue_time, self._prefill_time, self._decode_time, self._inference_time,
                                  self._inter_token)
        self.registry.register(_EngineCollector(self))
        self._add_request_metrics(max_model_len)

    def _add_request_metrics(self, max_model_len: int) -> None:
        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            family = Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry)
            return family.labels(self.model_name)

        success = Counter(PREFIX + "request_success", "Count of successfully processed requests.",
                          ["model_name", "finished_reason"], registry=self.registry)
        self._success = {reason: success.labels(self.model_name, reason) for reason in FINISH_REASONS}
        self._ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               TTFT_BUCKETS)
        self._e2e = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                              REQUEST_LATENCY_BUCKETS)
        tokens = token_buckets(max_model_len)
        self._prompt_tokens = histogram("request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self._generation_tokens = histogram("request_generation_tokens", "Number of generation tokens processed.",
                                            tokens)

    def record_engine(self, observations: EngineObservations) -> None:
        """The engine's timings since the last call (once per step at most)."""
        for histogram, values in zip(self.engine_histograms[:4], observations[:4], strict=True):
            for value in values:
                histogram.observe(value)
        for interval, count in observations.inter_token_latencies:
            self._inter_token.observe(interval, count)

    def observe_choice(self, finish_reason: str, num_prompt_tokens: int, num_generated_tokens: int,
                       time_to_first_token: float | None, latency: float) -> None:
        """One finished choice; `finish_reason` as the client saw it ("abort": the client left)."""
        self._success[finish_reason].inc()
        if time_to_first_token is not None:
            self._ttft.observe(time_to_first_token)
        self._e2e.observe(latency)
        self._prompt_tokens.observe(num_prompt_tokens)
        self._generation_tokens.observe(num_generated_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
