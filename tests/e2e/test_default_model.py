"""The real default model, SmolLM2-135M-Instruct (converted from its GGUF), behind a real server, asked
through the official SDK: right answers, streamed text equal to the non-streamed, the GGUF's chat
template applied (its default system prompt, and a system message that changes the answer)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.model_files.default_model import RECOMMENDED_SAMPLING
from tests.e2e.serving import RunningServer, server_config, start_server

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> Iterator[RunningServer]:
    running = start_server(smollm2_dir, server_config(served_model_names=(NAME,)))
    yield running
    running.stop()


def ask(server: RunningServer, question: str, system: str | None = None, max_tokens: int = 24) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    out = server.client().chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=max_tokens)
    return out.choices[0].message.content or ""


def test_answers_questions(smollm2: RunningServer) -> None:
    assert "Paris" in ask(smollm2, "What is the capital of France?")
    assert "5" in ask(smollm2, "What is 2+3?")


def test_streamed_text_equals_the_non_streamed(smollm2: RunningServer) -> None:
    messages = [{"role": "user", "content": "Name three colors."}]
    stream = smollm2.client().chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=20,
                                                       stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed and streamed == ask(smollm2, "Name three colors.", max_tokens=20)


def test_the_ggufs_chat_template_is_applied(smollm2: RunningServer) -> None:
    with smollm2.http() as http:
        body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}]}
        tokens = http.post("/tokenize", json=body).json()["tokens"]
        text = http.post("/detokenize", json={"model": NAME, "tokens": tokens}).json()["prompt"]
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the GGUF's template
    plain = ask(smollm2, "What is your name?")
    assert ask(smollm2, "What is your name?", system="You are a pirate named Captain Hook.") != plain



def test_a_request_without_sampling_fields_samples_at_the_cards_values(smollm2: RunningServer) -> None:
    """No temperature or top_p sent: the card's 0.2 and 0.9 (RECOMMENDED_SAMPLING), which the converted
    checkpoint's generation_config.json states: the same seeds draw the same answers as with them sent, and other
    answers than at the server's own temperature 1."""
    question = [{"role": "user", "content": "What is the capital of France?"}]

    def answers(**fields: float) -> list[str]:
        return [smollm2.client().chat.completions.create(model=NAME, messages=question, seed=seed, max_tokens=8,
                                                         **fields).choices[0].message.content or ""
                for seed in range(3)]

    at_defaults = answers()
    assert at_defaults == answers(**RECOMMENDED_SAMPLING)
    assert at_defaults != answers(temperature=1.0, top_p=1.0)
