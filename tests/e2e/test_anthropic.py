"""Anthropic's Messages API end to end with the official `anthropic` SDK: answers equal to chat's for the
same conversation, a stream equal to the answer in full, forced tool_use and a tool_result round
trip, count_tokens equal to the prompt the engine prefilled, prefix-cache hits as cache reads, stop
reasons (stop_sequence, model_context_window_exceeded), thinking blocks, and the requests counted in
/metrics like chat's. The wire itself (events, errors) is tested_anthropic_wire.py's.

The model is the tiny random one: an answer that should end on its own gets `min_tokens` and a
logit_bias on its end-of-text token; tool calls are forced (tool_choice, enforced with structured
output) with schemas of enums and booleans, so that they end within a few tokens. The SDK has no
sampling parameters any more: `temperature` and vLLM's extras go in `extra_body`.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
import pytest

from tests.chat_templates import HERMES_TOOLS_TEMPLATE
from tests.e2e.serving import MODEL, RunningServer, server_config, start_server

QUESTION = "What is the weather in Paris?"
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                   "metric": {"type": "boolean"}},
                  "required": ["city", "metric"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER_SCHEMA}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                                 "parameters": WEATHER_SCHEMA}}
GREEDY = {"temperature": 0}
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    config = server_config(chat_template=HERMES_TOOLS_TEMPLATE, reasoning_parser="qwen3")
    running = start_server(model_dir, config, max_model_len=MAX_MODEL_LEN)
    yield running
    running.stop()


def user(text: str = QUESTION) -> dict[str, object]:
    return {"role": "user", "content": text}


def test_an_answer_is_chats_for_the_same_conversation(server: RunningServer) -> None:
    message = server.anthropic().messages.create(model=MODEL, max_tokens=8, system="Be brief", messages=[user()],
                                                 extra_body=GREEDY)
    chat = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief"}, user()], max_tokens=8, temperature=0)
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_") and [block.type for block in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content and message.content[0].text
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == 8 and usage.cache_creation_input_tokens == 0


def test_the_stream_is_the_answer_in_full(server: RunningServer, ending: dict) -> None:
    client = server.anthropic()
    body = {"model": MODEL, "max_tokens": 64, "messages": [user("Stream this.")], "extra_body": GREEDY | ending}
    with client.messages.stream(**body) as stream:  # type: ignore[arg-type]
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    in_full = client.messages.create(**body)  # type: ignore[arg-type]
    assert streamed and streamed == final.content[0].text == in_full.content[0].text
    assert final.stop_reason == in_full.stop_reason == "end_turn"
    assert final.usage.output_tokens == in_full.usage.output_tokens == 5
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == (
        in_full.usage.input_tokens + in_full.usage.cache_read_input_tokens)


@pytest.mark.parametrize("tool_choice", [{"type": "tool", "name": "get_weather"},
                                         {"type": "any", "disable_parallel_tool_use": True}])
def test_a_forced_tool_use_and_its_result_round_trip(server: RunningServer, tool_choice: dict) -> None:
    client = server.anthropic()
    message = client.messages.create(model=MODEL, max_tokens=128, tools=[WEATHER], tool_choice=tool_choice,
                                     messages=[user()], extra_body=GREEDY)
    assert message.stop_reason == "tool_use" and [block.type for block in message.content] == ["tool_use"]
    use = message.content[0]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}
    conversation = [user(), message.to_param(), {"role": "user", "content": [result]}]
    answer = client.messages.create(model=MODEL, max_tokens=8, tools=[WEATHER], messages=conversation,
                                    extra_body=GREEDY)
    chat_conversation = [user(), {"role": "assistant", "content": None, "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "18 C and sunny"}]
    chat = server.client().chat.completions.create(model=MODEL, max_tokens=8, tools=[CHAT_WEATHER], temperature=0,
                                                   messages=chat_conversation)
    usage = answer.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert answer.content[0].type == "text" and answer.content[0].text == chat.choices[0].message.content


def test_a_streamed_tool_use_is_the_one_in_full(server: RunningServer) -> None:
    body = {"model": MODEL, "max_tokens": 128, "tools": [WEATHER], "tool_choice": {"type": "any"},
            "messages": [user()], "extra_body": GREEDY}
    client = server.anthropic()
    with client.messages.stream(**body) as stream:  # type: ignore[arg-type]
        events = list(stream)
        final = stream.get_final_message()
    in_full = client.messages.create(**body)  # type: ignore[arg-type]
    start = next(event for event in events if event.type == "content_block_start")
    assert start.content_block.type == "tool_use" and start.content_block.input == {}
    pieces = "".join(event.delta.partial_json for event in events
                     if event.type == "content_block_delta" and event.delta.type == "input_json_delta")
    assert json.loads(pieces) == final.content[0].input == in_full.content[0].input
    assert final.stop_reason == in_full.stop_reason == "tool_use"


def test_count_tokens_is_the_prompt_the_engine_prefilled(server: RunningServer) -> None:
    client = server.anthropic()
    body = {"model": MODEL, "system": "You forecast.", "tools": [WEATHER], "messages": [user("Count me, once.")]}
    counted = client.messages.count_tokens(**body)  # type: ignore[arg-type]
    message = client.messages.create(max_tokens=2, extra_body=GREEDY, **body)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens and message.usage.cache_read_input_tokens == 0
    again = client.messages.create(max_tokens=2, extra_body=GREEDY, **body)  # type: ignore[arg-type]
    cached = again.usage.cache_read_input_tokens
    assert cached > 0 and cached % 16 == 0 and again.usage.input_tokens + cached == counted.input_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(server: RunningServer) -> None:
    client = server.anthropic()
    text = client.messages.create(model=MODEL, max_tokens=16, messages=[user()], extra_body=GREEDY).content[0].text
    stop = text[4:7]
    message = client.messages.create(model=MODEL, max_tokens=16, messages=[user()], stop_sequences=[stop],
                                     extra_body=GREEDY)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == text[:text.index(stop)]


def test_an_answer_that_reaches_the_end_of_the_context_says_so(server: RunningServer) -> None:
    """A max_tokens beyond what the context leaves is cut to fit, as Claude Code's tens of thousands need."""
    client = server.anthropic()
    long = "words " * 100
    while (count := client.messages.count_tokens(model=MODEL, messages=[user(long)]).input_tokens) < MAX_MODEL_LEN - 8:
        long += "words " * max(1, (MAX_MODEL_LEN - 8 - count) // 4)
    room = MAX_MODEL_LEN - count
    assert 0 < room <= 8, "the prompt overshot the context"
    message = client.messages.create(model=MODEL, max_tokens=16000, messages=[user(long)],
                                     extra_body=GREEDY | {"ignore_eos": True})
    assert message.stop_reason == "model_context_window_exceeded" and message.usage.output_tokens == room
    short = client.messages.create(model=MODEL, max_tokens=2, messages=[user(long)], extra_body=GREEDY)
    assert short.stop_reason == "max_tokens"
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long: [0-9]+ tokens > 2047 maximum"):
        client.messages.create(model=MODEL, max_tokens=2, messages=[user(long + "words " * 8)])


def test_thinking_comes_as_thinking_blocks(server: RunningServer) -> None:
    """The server's reasoning parser splits thinking from the answer: a conversation whose assistant turn
    opened a <think> block (prefilled) is continued in thinking."""
    messages = [user(), {"role": "assistant", "content": "<think>\n"}]
    body = {"model": MODEL, "max_tokens": 6, "messages": messages, "extra_body": GREEDY}
    client = server.anthropic()
    with client.messages.stream(**body) as stream:  # type: ignore[arg-type]
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    in_full = client.messages.create(**body)  # type: ignore[arg-type]
    assert [block.type for block in in_full.content] == ["thinking"] and in_full.content[0].thinking
    assert final.content[0].thinking == in_full.content[0].thinking
    assert final.content[0].signature == in_full.content[0].signature and in_full.content[0].signature
    assert deltas[-1] == "signature_delta" and set(deltas[:-1]) == {"thinking_delta"}


@pytest.mark.parametrize(("answer", "kinds"), [
    ('<think>\nLet me look.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", '
     '"metric": true}}\n</tool_call>', ["thinking", "tool_use"]),
    ('<think>\nEasy.\n</think>\n\nIt is sunny.', ["thinking", "text"]),
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "metric": false}}\n'
     '</tool_call>', ["text", "tool_use"]),
], ids=["thinking-then-call", "thinking-then-text", "text-then-call"])
def test_what_the_model_writes_in_auto_is_parsed_into_blocks(server: RunningServer, answer: str, kinds: list) -> None:
    """The server's parsers (hermes, picked by `auto` from the template; qwen3 reasoning) read the answer, as on
    chat; the answer is made what a model of that family would write (vLLM's `structured_outputs` choice)."""
    body = {"model": MODEL, "max_tokens": 256, "tools": [WEATHER], "messages": [user()],
            "extra_body": GREEDY | {"structured_outputs": {"choice": [answer]}}}
    client = server.anthropic()
    with client.messages.stream(**body) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    in_full = client.messages.create(**body)  # type: ignore[arg-type]
    assert [block.type for block in in_full.content] == kinds
    assert [block.to_dict() for block in final.content if block.type != "tool_use"] == [
        block.to_dict() for block in in_full.content if block.type != "tool_use"]
    uses = [(block.name, block.input) for message in (final, in_full) for block in message.content
            if block.type == "tool_use"]
    if "tool_use" in kinds:
        assert in_full.stop_reason == final.stop_reason == "tool_use" and uses[0] == uses[1]
        assert uses[0][0] == "get_weather" and uses[0][1]["city"] in answer
    else:
        assert in_full.stop_reason == "end_turn" and in_full.content[-1].text == "It is sunny."


def test_messages_count_in_metrics_like_chats(server: RunningServer) -> None:
    before = server.wait_idle()
    message = server.anthropic().messages.create(model=MODEL, max_tokens=5, messages=[user("Metrics")],
                                                 extra_body=GREEDY)
    after = server.wait_idle()
    prompt_tokens = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert after["request_success_total{finished_reason=length}"] - before.get(
        "request_success_total{finished_reason=length}", 0) == 1
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == prompt_tokens
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 5
