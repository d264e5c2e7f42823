"""A real uvicorn server on a free localhost port, in a background thread, serving a tiny random
model built through the real checkpoint builder and loaded by the real loader. No mocks anywhere.
"""

import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from core import CacheConfig, EngineConfig, LLMEngine, ModelConfig, SchedulerConfig
from core.engine_process import EngineProcess
from core.serving_engine import ServingEngine
from openai_serve.app import build_app
from openai_serve.server import ServingServer
from openai_serve.server_config import ServerConfig

MODEL = "tiny"
ALIAS = "tiny-alias"
# Where the servers' engines run: the CPU, unless a GPU machine runs these tests against its GPUs
# (OPENAI_SERVE_E2E_DEVICE=cuda OPENAI_SERVE_E2E_TP=2 python -m pytest tests/e2e).
DEVICE = os.environ.get("OPENAI_SERVE_E2E_DEVICE", "cpu")
TENSOR_PARALLEL_SIZE = int(os.environ.get("OPENAI_SERVE_E2E_TP", "1"))


@dataclass
class RunningServer:
    server: ServingServer
    thread: threading.Thread
    engine: ServingEngine
    base_url: str
    api_key: str | None = None

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "unused", max_retries=0,
                             **kwargs)

    def async_client(self, **kwargs: object) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "unused", max_retries=0,
                                  **kwargs)

    def anthropic(self, **kwargs: object) -> "anthropic.Anthropic":  # noqa: F821 - imported where it is used
        """The official Anthropic SDK against this server's Messages API."""
        import anthropic  # here only: the GPU machine, which runs these tests with its own wheels, has no anthropic

        return anthropic.Anthropic(base_url=self.base_url, api_key=self.api_key or "unused", max_retries=0, **kwargs)

    def http(self, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60, **kwargs)

    def metrics(self) -> dict[str, float]:
        """/metrics read with Prometheus' own parser: {name: value}, the prefix dropped, and labels other
        than model_name kept in the key: `request_success_total{finished_reason=stop}`."""
        return parse_metrics(httpx.get(self.base_url + "/metrics", timeout=10).text)

    def wait_idle(self, timeout: float = 10.0) -> dict[str, float]:
        """Polls /metrics until nothing runs and no KV block is referenced; returns the last reading."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            busy = m["num_requests_running"] or m["num_requests_waiting"] or m["num_requests_in_flight"]
            idle = not busy
            if (idle and m["num_kv_blocks_used"] == 0) or time.monotonic() > deadline:
                return m
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.request_shutdown()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not shut down"


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            name = sample.name.removeprefix("openai_serve:")
            values[f"{name}{{{labels}}}" if labels else name] = sample.value
    return values


DEFAULT_SERVER = ServerConfig(served_model_names=(MODEL, ALIAS), port=0)


def start_server(model_dir: Path, config: ServerConfig = DEFAULT_SERVER, engine_process: bool = False,
                 **engine: object) -> RunningServer:
    """engine_process: the engine in its own process (core/engine_process.py), as `--engine-process` runs it. `engine`
    keys: max_model_len, num_blocks, device, tensor_parallel_size, task, speculative_config. float32 on every device:
    the tests compare tokens and logprobs across request paths (top_k=1 and min_p=1 against greedy, 36 concurrent
    streams against one at a time, echo against transformers), which bfloat16's rounding and tied logits could decide
    (on 2x H200 at TP=2 in bfloat16 two such comparisons parted; bfloat16 is the parity tests' business:
    tests/unit/test_cpu_linear.py, tests/gpu)."""
    device = str(engine.get("device", DEVICE))
    engine_config = EngineConfig(
        model=ModelConfig(model=str(model_dir), device=device, dtype="float32",
                          max_model_len=int(engine.get("max_model_len", 512)), task=str(engine.get("task", "auto")),
                          tensor_parallel_size=int(engine.get("tensor_parallel_size", TENSOR_PARALLEL_SIZE))),
        cache=CacheConfig(block_size=16, num_blocks=int(engine.get("num_blocks", 512))),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024,
                                  speculative_config=engine.get("speculative_config")),  # type: ignore[arg-type]
    )
    llm_engine: ServingEngine = EngineProcess(engine_config) if engine_process else LLMEngine(engine_config)
    server = ServingServer(build_app(llm_engine, config), config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = sock.getsockname()[1]
    return RunningServer(server, thread, llm_engine, f"http://127.0.0.1:{port}", config.api_key)


def server_config(**changes: object) -> ServerConfig:
    return replace(DEFAULT_SERVER, **changes)


def assert_error_shape(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and (error["code"] is None or isinstance(error["code"], str))
    return error
