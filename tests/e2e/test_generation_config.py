"""Default sampling from the served model's generation_config.json, end to end, on every route that samples: a
tiny model whose file says top_k 1 (greedy, whatever the seed) and max_new_tokens 6. What a request leaves out
takes those; what it sends wins."""

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.serving import MODEL, RunningServer, start_server

MODEL_DEFAULTS = {"top_k": 1, "max_new_tokens": 6}
SEEDS = range(3)
# Sent by every request, so that each runs to its max_tokens (random weights say EOS when they like).
IGNORE_EOS = {"ignore_eos": True}
Answer = tuple[str, int]  # the text, and how many tokens it has


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    model = tmp_path_factory.mktemp("generation-config") / "model"
    shutil.copytree(model_dir, model)
    generation = model / "generation_config.json"
    generation.write_text(json.dumps(json.loads(generation.read_text()) | MODEL_DEFAULTS))
    running = start_server(model)
    yield running
    running.stop()


def completion(server: RunningServer, fields: dict[str, object]) -> Answer:
    out = server.client().completions.create(model=MODEL, prompt="Once upon a time", extra_body=IGNORE_EOS | fields)
    return out.choices[0].text, out.usage.completion_tokens


def chat(server: RunningServer, fields: dict[str, object]) -> Answer:
    out = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                  extra_body=IGNORE_EOS | fields)
    return out.choices[0].message.content or "", out.usage.completion_tokens


def response(server: RunningServer, fields: dict[str, object]) -> Answer:
    out = server.client().responses.create(model=MODEL, input="Hi", extra_body=IGNORE_EOS | fields)
    return out.output_text, out.usage.output_tokens


def message(server: RunningServer, fields: dict[str, object]) -> Answer:
    """Anthropic's Messages API, whose max_tokens is required: sent as the model's default here, unless given."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6} | IGNORE_EOS | fields
    with server.http() as http:
        out = http.post("/v1/messages", json=body).json()
    return "".join(block["text"] for block in out["content"] if block["type"] == "text"), out["usage"]["output_tokens"]


@pytest.mark.parametrize("ask", [completion, chat, response, message])
def test_fields_left_out_take_the_models_defaults(server: RunningServer, ask: Callable[..., Answer]) -> None:
    greedy = ask(server, {"temperature": 0})
    assert greedy[1] == MODEL_DEFAULTS["max_new_tokens"]
    assert [ask(server, {"seed": seed}) for seed in SEEDS] == [greedy] * len(SEEDS)  # top_k 1: no seed matters


@pytest.mark.parametrize(("ask", "max_tokens_field"), [(completion, "max_tokens"), (chat, "max_completion_tokens"),
                                                       (response, "max_output_tokens"), (message, "max_tokens")])
def test_fields_sent_win(server: RunningServer, ask: Callable[..., Answer], max_tokens_field: str) -> None:
    greedy_text, _ = ask(server, {"temperature": 0})
    answers = [ask(server, {"seed": seed, "top_k": -1, max_tokens_field: 9}) for seed in SEEDS]  # -1: no top-k
    assert all(num_tokens == 9 for _, num_tokens in answers)
    assert any(not text.startswith(greedy_text) for text, _ in answers)  # sampled from more than the top token
