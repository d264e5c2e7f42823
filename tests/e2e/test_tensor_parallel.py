"""The server with `--tensor-parallel-size 2` on CPU (two gloo worker processes): the same streamed chat
as one rank; a worker that dies ends every stream with a terminal event and fails the engine, never a hang,
and the engine the server restarts serves again with new workers."""

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import LLMEngine
from core.config import engine_config
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, start_server
from tests.e2e.sse_client import DONE, iter_events
from tests.e2e.test_cli import ROOT, free_port, wait_healthy

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello! How are you?"}]


@pytest.fixture(scope="module")
def single_rank_server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, tensor_parallel_size=1, device="cpu")
    yield running
    running.stop()


def streamed_chat(client: object, **extra: object) -> tuple[str, str | None, object]:
    """The text, the finish reason and the usage (how the text is cut into chunks depends on timing)."""
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 40, "temperature": 0, **extra}
    chunks = list(client.chat.completions.create(  # type: ignore[attr-defined]
        stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-2].choices[0].finish_reason, chunks[-1].usage


def test_cli_with_two_ranks_streams_the_chat_of_one(model_dir: Path, single_rank_server: RunningServer) -> None:
    port = free_port()
    args = [sys.executable, "-m", "openai_serve", "--config", str(ROOT / "configs" / "tiny-cpu.json"),
            "--model", str(model_dir), "--port", str(port), "--served-model-name", MODEL,
            "--tensor-parallel-size", "2", "--kv-cache-blocks", "128"]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", process, timeout=240)
        two_ranks = RunningServer(None, None, None, f"http://127.0.0.1:{port}")  # type: ignore[arg-type]
        expected = streamed_chat(single_rank_server.client())
        assert streamed_chat(two_ranks.client()) == expected
        assert expected[2].completion_tokens > 5  # a real answer, not one that ended at once
        seeded = {"temperature": 1.0, "seed": 5, "extra_body": {"ignore_eos": True}}
        assert streamed_chat(two_ranks.client(), **seeded)[0] == streamed_chat(single_rank_server.client(),
                                                                                **seeded)[0]
        assert two_ranks.wait_idle()["num_kv_blocks_used"] == 0
    finally:
        process.terminate()
        process.wait(timeout=30)
    log = process.stdout.read() if process.stdout else ""
    assert "tensor parallel: 2 ranks on cpu" in log


def test_a_dead_worker_ends_every_stream_and_the_restarted_engine_serves(model_dir: Path) -> None:
    running = start_server(model_dir, tensor_parallel_size=2, device="cpu")
    workers = running.engine.runner._workers  # type: ignore[attr-defined]
    try:
        with running.http() as http:
            body = {"model": MODEL, "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
            with http.stream("POST", "/v1/completions", json=body) as response:
                events = iter_events(response.iter_lines())
                next(events)
                start = time.monotonic()
                # Rank 1: the engine waits for rank 0's tokens, and must still not wait forever.
                workers[1].process.kill()
                rest = list(events)
            assert time.monotonic() - start < 30
            assert rest[-1] == DONE and '"engine_failed"' in rest[-2] and "tensor-parallel" in rest[-2]
            error = assert_error_shape(http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}), 503)
            assert error["code"] in ("engine_restarting", "engine_failed")
            assert all(w.process.poll() is not None for w in workers), "the surviving rank was stopped too"
            deadline = time.monotonic() + 180  # the server restarts its engine: new workers
            while (health := http.get("/health")).status_code != 200:
                assert time.monotonic() < deadline, "the engine was not restarted"
                time.sleep(0.2)
            assert health.json()["engine_restarts"] == 1
            answer = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    finally:
        running.stop()


def test_a_model_that_cannot_be_split_fails_at_start_with_the_reason(model_dir: Path) -> None:
    config = engine_config(str(model_dir), device="cpu", tensor_parallel_size=3, kv_cache_blocks=8)
    with pytest.raises(RuntimeError, match=r"\(128\) must be divisible by the tensor-parallel size \(3\)"):
        LLMEngine(config)
