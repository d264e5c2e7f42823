"""/metrics after real traffic, read with Prometheus' own text parser: counters and histogram counts
match the requests sent (tokens, finish reasons, one TTFT per request), with the engine in its own
process (the default), so the engine's figures have crossed the pipe; names, types, buckets and
the model_name label as vLLM's.
"""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openai_serve.metrics import INTER_TOKEN_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from tests.e2e.serving import MODEL, RunningServer, start_server
from tests.e2e.sse_client import iter_events

HISTOGRAMS = ["time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_prefill_time_seconds", "request_decode_time_seconds", "request_inference_time_seconds",
              "request_prompt_tokens", "request_generation_tokens"]


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, engine_process=True)
    yield running
    running.stop()


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_counters_and_histograms_match_the_requests_sent(server: RunningServer) -> None:
    client = server.client()
    before = server.wait_idle()
    prompts = [[5 + i] * (20 + 7 * i) for i in range(4)]
    responses = [client.completions.create(model=MODEL, prompt=p, max_tokens=6 + i, temperature=1.0, seed=i)
                 for i, p in enumerate(prompts)]
    responses.append(client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=9, temperature=0,
                                               extra_body={"ignore_eos": True}))
    after = server.wait_idle()
    num_requests = len(responses)
    prompt_tokens = sum(r.usage.prompt_tokens for r in responses)
    completion_tokens = sum(r.usage.completion_tokens for r in responses)
    for reason in ("stop", "length"):
        expected = sum(r.choices[0].finish_reason == reason for r in responses)
        assert delta(after, before, f"request_success_total{{finished_reason={reason}}}") == expected
    assert delta(after, before, "request_success_total{finished_reason=abort}") == 0
    assert delta(after, before, "prompt_tokens_total") == prompt_tokens
    assert delta(after, before, "generation_tokens_total") == completion_tokens
    for name in HISTOGRAMS:
        assert delta(after, before, f"{name}_count") == num_requests, name
    assert delta(after, before, "request_prompt_tokens_sum") == prompt_tokens
    assert delta(after, before, "request_generation_tokens_sum") == completion_tokens
    # Every token after a request's first one is one inter-token interval.
    assert delta(after, before, "inter_token_latency_seconds_count") == completion_tokens - num_requests
    # The last request repeats the first prompt: its full blocks came from the prefix cache.
    assert responses[-1].usage.prompt_tokens_details.cached_tokens == 16
    assert delta(after, before, "prefix_cache_hits_total") == 16
    assert delta(after, before, "prefix_cache_queries_total") == prompt_tokens
    assert delta(after, before, "num_preemptions_total") == 0
    assert after["kv_cache_usage_perc"] == 0


def test_a_client_that_leaves_counts_as_abort_and_usage_shows_while_running(server: RunningServer) -> None:
    before = server.wait_idle()
    with server.http() as http:
        body = {"model": MODEL, "prompt": "count", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            events = iter_events(response.iter_lines())
            next(events)
            next(events)
            running = server.metrics()
    after = server.wait_idle()
    assert running["num_requests_running"] == 1 and 0 < running["kv_cache_usage_perc"] < 1
    assert delta(after, before, "request_success_total{finished_reason=abort}") == 1
    assert delta(after, before, "time_to_first_token_seconds_count") == 1
    assert 2 <= delta(after, before, "request_generation_tokens_sum") < 300
    assert after["kv_cache_usage_perc"] == 0


def test_names_types_buckets_and_labels_are_vllms(server: RunningServer) -> None:
    server.client().completions.create(model=MODEL, prompt="hi", max_tokens=3)
    server.wait_idle()
    text = httpx.get(server.base_url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("openai_serve:")}
    types = {name.removeprefix("openai_serve:"): f.type for name, f in families.items()}
    assert {name: types.get(name) for name in HISTOGRAMS + ["inter_token_latency_seconds"]} == {
        name: "histogram" for name in HISTOGRAMS + ["inter_token_latency_seconds"]}
    for name in ("prompt_tokens", "generation_tokens", "request_success", "prefix_cache_queries",
                 "prefix_cache_hits", "num_preemptions"):
        assert types.get(name) == "counter", name
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert types.get(name) == "gauge", name
    for family in families.values():
        assert family.documentation, family.name
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL, sample

    def bounds(name: str) -> list[float]:
        family = families["openai_serve:" + name]
        return [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")][:-1]  # less +Inf

    assert bounds("time_to_first_token_seconds") == list(TTFT_BUCKETS)
    assert bounds("inter_token_latency_seconds") == list(INTER_TOKEN_BUCKETS)
    assert bounds("e2e_request_latency_seconds") == list(REQUEST_LATENCY_BUCKETS)
    assert bounds("request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200, 500]  # up to max_model_len 512
    assert "# HELP openai_serve:time_to_first_token_seconds " in text
    assert "# TYPE openai_serve:prompt_tokens_total counter" in text
