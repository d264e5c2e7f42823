"""Penalties, logit_bias and structured output end to end: the official SDK (including
`chat.completions.parse(Model)`) and raw HTTP, against the engine as a thread and in its own process."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, start_server


@pytest.fixture(scope="module", params=["thread", "process"])
def server(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = start_server(model_dir, engine_process=request.param == "process")
    yield running
    running.stop()


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=0, le=120)
    admin: bool


def test_sdk_parse_returns_a_parsed_object(server: RunningServer) -> None:
    client = server.client()
    parsed = []
    for seed in range(6):
        completion = client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Who are you?"}], response_format=Person,
            max_tokens=64, seed=seed)
        message = completion.choices[0].message
        if completion.choices[0].finish_reason == "stop":
            assert isinstance(message.parsed, Person)
            parsed.append(message.parsed)
    assert len(parsed) >= 4


def test_json_object_and_vllm_structured_outputs(server: RunningServer) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "Answer"}]
    choice = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, seed=1,
                                            extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}})
    assert choice.choices[0].message.content in ("red", "green", "blue")
    regex = client.completions.create(model=MODEL, prompt="Code:", max_tokens=16, seed=2,
                                      extra_body={"structured_outputs": {"regex": r"[A-Z]{3}-\d{2}"}})
    assert re.fullmatch(r"[A-Z]{3}-\d{2}", regex.choices[0].text)
    guided = client.completions.create(model=MODEL, prompt="Pick:", max_tokens=8, seed=3,
                                       extra_body={"guided_choice": ["yes", "no"]})
    assert guided.choices[0].text in ("yes", "no")
    obj = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, seed=4,
                                         response_format={"type": "json_object"})
    text = obj.choices[0].message.content
    assert text.startswith("{")
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


# Person's JSON in json.dumps's layout (core/grammar.py) is at most about 100 bytes (a name of 8 characters,
# each at most a 6-byte escape), and a token is at least one byte: the grammar always ends it within this many.
PERSON_MAX_TOKENS = 256


def test_streamed_structured_output_is_valid_too(server: RunningServer) -> None:
    stream = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=PERSON_MAX_TOKENS, seed=5, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema(),
                                                                "strict": True}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    assert isinstance(Person.model_validate_json(text), Person)


def test_penalties_and_logit_bias_are_applied(server: RunningServer) -> None:
    client = server.client()
    greedy = {"temperature": 0.0, "ignore_eos": True}
    plain = client.completions.create(model=MODEL, prompt="a b a b a b", max_tokens=16, extra_body=greedy)
    penalized = client.completions.create(model=MODEL, prompt="a b a b a b", max_tokens=16, frequency_penalty=2.0,
                                          presence_penalty=1.0, extra_body={**greedy, "repetition_penalty": 1.5})
    assert penalized.choices[0].text != plain.choices[0].text
    forced = client.completions.create(model=MODEL, prompt="x", max_tokens=5, logit_bias={"65": 100},
                                       extra_body={"ignore_eos": True})
    with server.http() as http:
        token_ids = http.post("/tokenize", json={"prompt": forced.choices[0].text,
                                                 "add_special_tokens": False}).json()["tokens"]
    assert set(token_ids) == {65}


@pytest.mark.parametrize(("body", "param"), [
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strang"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"uniqueItems": True}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens"),
])
def test_bad_values_are_400s_naming_the_field(server: RunningServer, body: dict, param: str) -> None:
    with server.http() as http:
        response = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                           "messages": [{"role": "user", "content": "hi"}], **body})
        error = assert_error_shape(response, 400)
        assert error["param"] == param, error
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2}).status_code == 200
    assert server.wait_idle()["num_kv_blocks_used"] == 0


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(server: RunningServer) -> None:
    stream = server.client().completions.create(
        model=MODEL, prompt="count", max_tokens=6, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    completion_tokens = [c.usage.completion_tokens for c in chunks]
    assert completion_tokens == sorted(completion_tokens) and completion_tokens[-1] == 6
    assert len({c.usage.prompt_tokens for c in chunks}) == 1
    plain = list(server.client().completions.create(model=MODEL, prompt="count", max_tokens=3, stream=True,
                                                    stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens <= 3
