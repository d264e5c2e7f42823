"""The `openai-serve` command as a user runs it: a subprocess with --config and flags, then SIGINT
while a stream is running (the stream gets its terminal event and the process exits cleanly)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from tests.e2e.sse_client import DONE, iter_events

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(base_url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else "exited"
        try:
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become healthy")


def test_help_names_the_vllm_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "openai_serve", "--help"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    for flag in ("--model", "--served-model-name", "--host", "--port", "--api-key", "--allowed-origins",
                 "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--block-size",
                 "--kv-cache-blocks", "--gpu-memory-utilization", "--dtype", "--device", "--enforce-eager",
                 "--no-enable-prefix-caching", "--chat-template", "--seed", "--config"):
        assert flag in out, flag


def test_cli_serves_and_shuts_down_on_sigint(model_dir: Path) -> None:
    port = free_port()
    args = [sys.executable, "-m", "openai_serve", "--config", str(ROOT / "configs" / "tiny-cpu.json"),
            "--model", str(model_dir), "--port", str(port), "--served-model-name", "cli-model"]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, process)
        models = httpx.get(base_url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["cli-model"] and models["data"][0]["max_model_len"] == 1024
        body = {"model": "cli-model", "prompt": "Hello", "max_tokens": 900, "ignore_eos": True, "stream": True}
        events = []
        with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=30) as response:
            for event in iter_events(response.iter_lines()):
                events.append(event)
                if len(events) == 3:
                    process.send_signal(signal.SIGINT)
        assert events[-1] == DONE and json.loads(events[-2])["error"]["code"] == "shutting_down"
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = process.stdout.read() if process.stdout else ""
    assert "cli-model" in log


def test_the_readmes_first_command_serves_the_default_model_offline(smollm2_dir: Path) -> None:
    """`openai-serve` with no arguments, as the README starts it, once the default model is in the cache
    (the smollm2_dir fixture fetched it): no package index is reachable, and it answers correctly."""
    port = free_port()
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(smollm2_dir / "no-links")}
    process = subprocess.Popen([sys.executable, "-m", "openai_serve", "--port", str(port)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, process)
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["smollm2-135m-instruct"]
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answer = client.chat.completions.create(model="smollm2-135m-instruct", messages=question, temperature=0,
                                                max_tokens=16)
        assert "Paris" in (answer.choices[0].message.content or "")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
