"""Anthropic's Messages API on the real default model, SmolLM2-135M-Instruct, through the official
`anthropic` SDK: right answers, a streamed answer equal to the one in full (greedy), a forced tool
call whose input comes from the question and a tool result the answer then uses, and count_tokens
equal to the prompt the engine prefilled."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.serving import RunningServer, server_config, start_server

NAME = "smollm2-135m-instruct"
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> Iterator[RunningServer]:
    running = start_server(smollm2_dir, server_config(served_model_names=(NAME,)))
    yield running
    running.stop()


def test_answers_a_question_and_ends_its_turn(smollm2: RunningServer) -> None:
    message = smollm2.anthropic().messages.create(model=NAME, max_tokens=48, extra_body=GREEDY, messages=[
        {"role": "user", "content": "What is the capital of France?"}])
    assert message.stop_reason == "end_turn" and "Paris" in message.content[0].text


def test_the_streamed_text_is_the_text_in_full(smollm2: RunningServer) -> None:
    client = smollm2.anthropic()
    body = {"model": NAME, "max_tokens": 24, "messages": [{"role": "user", "content": "Name three colors."}],
            "extra_body": GREEDY}
    with client.messages.stream(**body) as stream:  # type: ignore[arg-type]
        streamed = "".join(stream.text_stream)
    in_full = client.messages.create(**body)  # type: ignore[arg-type]
    assert streamed and streamed == in_full.content[0].text


def test_a_forced_tool_call_and_its_result(smollm2: RunningServer) -> None:
    client = smollm2.anthropic()
    call = client.messages.create(model=NAME, max_tokens=64, tools=[WEATHER], tool_choice={"type": "any"},
                                  messages=[QUESTION], extra_body=GREEDY)
    assert call.stop_reason == "tool_use" and call.content[0].type == "tool_use"
    assert call.content[0].input == {"city": "Paris"}
    result = {"type": "tool_result", "tool_use_id": call.content[0].id, "content": "18 degrees Celsius and sunny"}
    answer = client.messages.create(model=NAME, max_tokens=64, tools=[WEATHER], extra_body=GREEDY,
                                    messages=[QUESTION, call.to_param(), {"role": "user", "content": [result]}])
    assert answer.stop_reason == "end_turn" and "18 degrees" in answer.content[0].text


def test_count_tokens_is_the_prompt_prefilled(smollm2: RunningServer) -> None:
    client = smollm2.anthropic()
    body = {"model": NAME, "system": "You are terse.", "messages": [{"role": "user", "content": "Count these words."}]}
    counted = client.messages.count_tokens(**body)  # type: ignore[arg-type]
    message = client.messages.create(max_tokens=1, extra_body=GREEDY, **body)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens > 10
    assert message.usage.cache_read_input_tokens == 0
