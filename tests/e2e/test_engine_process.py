"""The engine in its own process (`--engine-process`): the same answers as the in-process engine,
and the same behaviour under concurrency, disconnects and bad input; a dead engine process turns
into 503s, never a hung request.

The concurrency and error tests of the in-process server, and some of the Responses API's, are
collected again here (imported) and run against this module's `server`, the process-backed one.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.engine_process import EngineProcess
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, start_server
from tests.e2e.sse_client import DONE, iter_events
from tests.e2e.test_concurrency import (  # noqa: F401 - collected again, with this module's server
    test_36_concurrent_streams_equal_one_at_a_time,
    test_disconnects_abort_sequences_and_free_every_block,
)
from tests.e2e.test_errors import (  # noqa: F401 - collected again, with this module's server
    test_bad_bodies_get_a_4xx_naming_the_parameter,
    test_bad_requests_do_not_disturb_a_running_stream,
    test_sdk_raises_typed_errors,
)
from tests.e2e.test_responses import (  # noqa: F401 - collected again, with this module's server
    test_an_answer_is_chats_for_the_same_conversation,
    test_previous_response_id_continues_the_conversation,
    test_the_stream_is_typed_events_in_order_and_its_final_response,
)

PROMPTS = ["Hello there", "The capital of France is", "1 2 3 4"]


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, engine_process=True)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def in_process_server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir)
    yield running
    running.stop()


def test_same_greedy_and_seeded_answers_as_the_in_process_engine(
    server: RunningServer, in_process_server: RunningServer
) -> None:
    def answers(running: RunningServer) -> list[object]:
        client = running.client()
        out: list[object] = []
        for prompt in PROMPTS:
            greedy = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
            seeded = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.0, seed=7,
                                               n=2)
            out.append((greedy.choices[0].text, greedy.choices[0].logprobs.tokens,
                        [round(x, 4) for x in greedy.choices[0].logprobs.token_logprobs],
                        [c.text for c in seeded.choices], greedy.usage.completion_tokens))
        return out

    assert answers(server) == answers(in_process_server)
    assert server.wait_idle()["num_kv_blocks_used"] == 0


def test_metrics_follow_the_engine_in_the_other_process(server: RunningServer) -> None:
    with server.http() as http:
        body = {"model": MODEL, "prompt": "count", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            events = iter_events(response.iter_lines())
            next(events)
            running = server.metrics()  # the stats the engine process sent with its last step
            list(events)
    assert running["num_requests_running"] == 1 and running["num_kv_blocks_used"] > 0
    metrics = server.wait_idle()
    assert metrics["num_kv_blocks"] == 512 and metrics["num_kv_blocks_used"] == 0
    assert metrics["num_kv_blocks_free"] + metrics["num_kv_blocks_evictable"] == 512


def test_a_dead_engine_process_ends_streams_with_503s_and_is_restarted(model_dir: Path) -> None:
    running = start_server(model_dir, engine_process=True)
    try:
        with running.http() as http:
            body = {"model": MODEL, "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
            with http.stream("POST", "/v1/completions", json=body) as response:
                events = iter_events(response.iter_lines())
                next(events)
                running.engine._process.kill()  # type: ignore[attr-defined]  # the device lost, the OOM killer
                rest = list(events)
            assert rest[-1] == DONE and '"engine_failed"' in rest[-2]
            error = assert_error_shape(http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}), 503)
            assert error["code"] in ("engine_restarting", "engine_failed")
            deadline = time.monotonic() + 60
            while (health := http.get("/health")).status_code != 200:
                assert assert_error_shape(health, 503)["code"] == "engine_restarting"
                assert time.monotonic() < deadline, "the engine was not restarted"
                time.sleep(0.1)
            assert health.json()["engine_restarts"] == 1
            answer = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    finally:
        running.stop()


def test_the_engine_process_freezes_its_start_up_heap(server: RunningServer) -> None:
    """The child's garbage collector skips what start-up left alive (torch and the model: far over 10k objects),
    so no full collection walks it inside an engine step."""
    assert isinstance(server.engine, EngineProcess)
    assert server.engine.frozen_start_up_objects > 10_000
