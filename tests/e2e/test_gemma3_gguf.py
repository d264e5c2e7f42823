"""The real Gemma 3 270M served from its GGUF file (resolved as `openai-serve gemma-3-270m-q4_k_m.gguf` resolves
it) behind a real server: /v1/completions continues code as transformers does on the same file (checked in
tests/parity/test_parity_gemma3_gguf.py), streamed text equals the non-streamed, a prompt past the 512-token window
completes; a base model without a chat template answers /v1/chat/completions with a clear 400 and keeps serving."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.model_files import resolve_model
from tests.e2e.serving import RunningServer, assert_error_shape, server_config, start_server

NAME = "gemma-3-270m"
FIBONACCI = "\n    if n == 0:\n        return 0\n    elif n == 1"


@pytest.fixture(scope="module")
def gemma3(gemma3_270m_gguf_path: Path) -> Iterator[RunningServer]:
    model_dir = resolve_model(str(gemma3_270m_gguf_path), "float32", "cpu").path
    running = start_server(model_dir, server_config(served_model_names=(NAME,)), max_model_len=2048, num_blocks=256)
    yield running
    running.stop()


def complete(server: RunningServer, prompt: str, max_tokens: int = 20) -> str:
    out = server.client().completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=max_tokens)
    return out.choices[0].text


def test_completes_code(gemma3: RunningServer) -> None:
    assert complete(gemma3, "def fibonacci(n):").startswith(FIBONACCI)


def test_streamed_text_equals_the_non_streamed(gemma3: RunningServer) -> None:
    stream = gemma3.client().completions.create(model=NAME, prompt="def fibonacci(n):", temperature=0,
                                                max_tokens=20, stream=True)
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert streamed.startswith(FIBONACCI) and streamed == complete(gemma3, "def fibonacci(n):")


def test_a_prompt_past_the_window(gemma3: RunningServer) -> None:
    prompt = ", ".join(str(i) for i in range(1, 260)) + ","
    out = gemma3.client().completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=8)
    assert out.usage.prompt_tokens > 1000
    assert out.choices[0].text.startswith(" 260, 26")


def test_chat_without_a_chat_template_is_a_clear_400(gemma3: RunningServer) -> None:
    with gemma3.http() as http:
        body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}]}
        response = http.post("/v1/chat/completions", json=body)
    error = assert_error_shape(response, 400)
    assert "no chat template" in error["message"] and "/v1/completions" in error["message"]
    assert error["param"] == "messages"
    assert complete(gemma3, "def fibonacci(n):").startswith(FIBONACCI)  # still serving
    assert gemma3.wait_idle()["num_kv_blocks_used"] == 0
