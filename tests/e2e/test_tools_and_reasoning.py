"""Tools and thinking end to end, on a server whose chat template shows tools as Hermes/Qwen do (so
`--tool-call-parser auto` reads `<tool_call>` JSON) and splits thinking with `--reasoning-parser
deepseek_r1` (answers start inside a think block). The tiny model is random: it writes no call of
its own accord, so vLLM's `structured_outputs` makes it write one where a test needs it; the
parsers' cases are in tests/unit/test_parsers_*.py, forced calls in test_client_libraries.py."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chat_templates import HERMES_TOOLS_TEMPLATE
from tests.e2e.serving import MODEL, RunningServer, server_config, start_server
from tests.e2e.sse_client import iter_typed_events, post_stream

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}
RAW_GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    config = server_config(chat_template=HERMES_TOOLS_TEMPLATE, reasoning_parser="deepseek_r1")
    running = start_server(model_dir, config)
    yield running
    running.stop()


def rendered(server: RunningServer, **body: object) -> str:
    with server.http() as http:
        tokens = http.post("/tokenize", json={"messages": MESSAGES, **body}).json()["tokens"]
        return http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]


def test_tools_reach_the_prompt(server: RunningServer) -> None:
    with_tools = server.client().chat.completions.create(messages=MESSAGES, tools=[WEATHER], **GREEDY)
    without = server.client().chat.completions.create(messages=MESSAGES, **GREEDY)
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens
    assert '"name": "get_weather"' in rendered(server, tools=[WEATHER])


def test_calls_and_replies_go_back_through_the_template(server: RunningServer) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    prompt = rendered(server, messages=history, tools=[WEATHER])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt
    out = server.client().chat.completions.create(messages=history, tools=[WEATHER], **GREEDY)
    assert out.choices[0].finish_reason == "length"


def test_thinking_goes_to_reasoning_content(server: RunningServer) -> None:
    out = server.client().chat.completions.create(messages=MESSAGES, **GREEDY)
    message = out.choices[0].message.model_dump()
    # deepseek_r1: an answer that never closes its think block is all reasoning
    assert message["reasoning_content"] and message["reasoning_content"] == message["reasoning"]
    assert message["content"] is None and out.usage.completion_tokens == 8


def test_streamed_thinking_adds_up_to_the_answer_in_full(server: RunningServer) -> None:
    whole = server.client().chat.completions.create(messages=MESSAGES, **GREEDY).choices[0].message
    with server.http() as http:
        chunks = post_stream(http, CHAT, RAW_GREEDY | {"messages": MESSAGES, "stream": True}).chunks
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == whole.model_dump()["reasoning_content"]
    assert all(d.get("reasoning_content") == d.get("reasoning") for d in deltas)
    assert all(not d.get("content") for d in deltas)


def test_reasoning_effort_reaches_the_template(server: RunningServer) -> None:
    assert "Reasoning effort: high" in rendered(server, reasoning_effort="high")
    client = server.client()
    high = client.chat.completions.create(messages=MESSAGES, reasoning_effort="high", **GREEDY)
    plain = client.chat.completions.create(messages=MESSAGES, **GREEDY)
    assert high.usage.prompt_tokens > plain.usage.prompt_tokens


def test_tool_choice_none_and_auto_without_a_call_answer_text(server: RunningServer) -> None:
    for choice in ("none", "auto"):
        out = server.client().chat.completions.create(messages=MESSAGES, tools=[WEATHER], tool_choice=choice,
                                                      **GREEDY)
        assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "length"


# vLLM's structured_outputs can make even a random model write a given answer: here, thinking and a
# call the way Hermes/Qwen write them, so the parsers run on a real answer of the server.
THOUGHT_AND_CALL = ('Paris, then.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                    '</tool_call>')


def scripted(answer: str) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "tools": [WEATHER], "max_tokens": 130, "seed": 0,
            "structured_outputs": {"choice": [answer]}}


def test_a_call_the_model_writes_is_read_into_tool_calls(server: RunningServer) -> None:
    with server.http() as http:
        whole = http.post(CHAT, json=scripted(THOUGHT_AND_CALL)).json()["choices"][0]
        chunks = post_stream(http, CHAT, scripted(THOUGHT_AND_CALL) | {"stream": True}).chunks
    assert whole["finish_reason"] == "tool_calls"
    message = whole["message"]
    assert message["reasoning_content"] == "Paris, then." and message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    streamed = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert streamed[0]["function"]["name"] == "get_weather" and streamed[0]["id"].startswith("call_")
    assert "".join(d["function"]["arguments"] for d in streamed) == call["function"]["arguments"]
    assert "".join(d["delta"].get("reasoning_content") or "" for d in deltas) == "Paris, then."
    assert not any(d["delta"].get("content") for d in deltas) and deltas[-1]["finish_reason"] == "tool_calls"


def test_tool_choice_none_leaves_a_written_call_as_text(server: RunningServer) -> None:
    with server.http() as http:
        choice = http.post(CHAT, json=scripted(THOUGHT_AND_CALL) | {"tool_choice": "none"}).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"].startswith("<tool_call>\n{")


# --- the Responses API: thinking as reasoning items ---------------------------------------------------


def test_responses_put_thinking_into_a_reasoning_item(server: RunningServer) -> None:
    response = server.client().responses.create(model=MODEL, input=MESSAGES, temperature=0, max_output_tokens=8,
                                                extra_body={"ignore_eos": True})
    chat = server.client().chat.completions.create(messages=MESSAGES, **GREEDY).choices[0].message.model_dump()
    assert [item.type for item in response.output] == ["reasoning"]  # never closed: all reasoning
    reasoning = response.output[0]
    assert reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text == chat["reasoning_content"]
    assert reasoning.summary == [] and reasoning.status == "incomplete" and response.status == "incomplete"
    assert response.usage.output_tokens_details.reasoning_tokens == response.usage.output_tokens == 8


def test_streamed_reasoning_adds_up_to_the_item(server: RunningServer) -> None:
    with server.client().responses.stream(model=MODEL, input=MESSAGES, temperature=0, max_output_tokens=8,
                                          extra_body={"ignore_eos": True}) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[2].item.type == "reasoning" and kinds[-1] == "response.incomplete"
    text = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    done = next(event for event in events if event.type == "response.reasoning_text.done")
    assert text and text == done.text == events[-1].response.output[0].content[0].text


def test_responses_reasoning_effort_and_reasoning_items_reach_the_template(server: RunningServer) -> None:
    client = server.client()
    effort = client.responses.create(model=MODEL, input=MESSAGES, reasoning={"effort": "high"}, max_output_tokens=1)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, reasoning_effort="high", max_tokens=1)
    assert effort.usage.input_tokens == chat.usage.prompt_tokens
    thought = {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "It is about Paris."}]}
    said = {"role": "assistant", "content": "Sunny."}
    with_thought = client.responses.create(model=MODEL, input=[*MESSAGES, thought, said], max_output_tokens=1)
    history = [*MESSAGES, {"role": "assistant", "content": "Sunny.", "reasoning_content": "It is about Paris."}]
    assert with_thought.usage.input_tokens == client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=1).usage.prompt_tokens
    assert "It is about Paris." in rendered(server, messages=history)


def test_responses_read_a_written_thought_and_call_into_items(server: RunningServer) -> None:
    flat_weather = {"type": "function", **WEATHER["function"]}
    body = {"model": MODEL, "input": MESSAGES, "tools": [flat_weather], "max_output_tokens": 130, "seed": 0,
            "structured_outputs": {"choice": [THOUGHT_AND_CALL]}}
    with server.http() as http:
        whole = http.post("/v1/responses", json=body).json()
        with http.stream("POST", "/v1/responses", json=body | {"stream": True}) as response:
            events = [data for _, data in iter_typed_events(response.iter_lines())]
    assert whole["status"] == "completed"
    thought, call = whole["output"]
    assert thought["type"] == "reasoning" and thought["content"] == [{"type": "reasoning_text", "text": "Paris, then."}]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["call_id"].startswith("call_")
    assert call["arguments"] == '{"city": "Paris"}' and call["status"] == "completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert (text, arguments) == ("Paris, then.", call["arguments"])
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert [{**item, "id": None, "call_id": None} for item in final["output"]] == [
        {**item, "id": None, "call_id": None} for item in whole["output"]]
