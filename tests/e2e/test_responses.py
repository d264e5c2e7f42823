"""The Responses API end to end with the official SDK (and raw HTTP where the wire matters): answers
that equal chat's for the same conversation, the typed event stream and its final response, parse
with a text_format, a function tool round trip, previous_response_id, the store, background and
cancel, disconnects, and openai-agents' default (Responses) model running an agent with a tool.

The model is the tiny random one: an answer that should end on its own gets `min_tokens` and a
logit_bias on its end-of-text token (it ends right after that many tokens); a tool call is forced
(tool_choice, enforced with structured output); schemas are enums and booleans so that a forced
answer ends within a few tokens.
"""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.chat_templates import HERMES_TOOLS_TEMPLATE
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, server_config, start_server
from tests.e2e.sse_client import iter_typed_events

City = Literal["Paris", "Rome", "Oslo"]
QUESTION = "What is the weather in Paris?"
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                       "metric": {"type": "boolean"}},
                      "required": ["city", "metric"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast",
           "parameters": WEATHER_PARAMETERS, "strict": True}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                                 "parameters": WEATHER_PARAMETERS, "strict": True}}
GREEDY = {"model": MODEL, "temperature": 0, "max_output_tokens": 8}
FORCED_MAX_TOKENS = 128


class Forecast(BaseModel):
    city: City
    metric: bool


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    # Tool schemas in the prompt take hundreds of tokens of the tiny vocabulary.
    running = start_server(model_dir, server_config(chat_template=HERMES_TOOLS_TEMPLATE), max_model_len=2048)
    yield running
    running.stop()


def chat_answer(server: RunningServer, messages: list[dict], max_tokens: int = 8, **body: object):  # noqa: ANN201
    return server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                   max_tokens=max_tokens, **body)


@pytest.mark.parametrize(("kwargs", "messages"), [
    ({"input": QUESTION, "instructions": "Be brief"},
     [{"role": "system", "content": "Be brief"}, {"role": "user", "content": QUESTION}]),
    ({"input": [{"role": "developer", "content": "Be brief"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather"},
                                                                {"type": "input_text", "text": "in Paris?"}]}]},
     [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Weather\nin Paris?"}]),
])
def test_an_answer_is_chats_for_the_same_conversation(server: RunningServer, kwargs: dict, messages: list) -> None:
    response = server.client().responses.create(**GREEDY, **kwargs)
    chat = chat_answer(server, messages)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert response.output_text == chat.choices[0].message.content and response.output_text
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens and usage.output_tokens == 8
    assert usage.total_tokens == usage.input_tokens + 8 and usage.output_tokens_details.reasoning_tokens == 0
    assert response.instructions == kwargs.get("instructions") and response.max_output_tokens == 8


def test_an_answer_that_ends_is_completed(server: RunningServer, ending: dict) -> None:
    response = server.client().responses.create(model=MODEL, input=QUESTION, extra_body=ending)
    assert response.status == "completed" and response.incomplete_details is None
    assert response.usage.output_tokens == 5 and response.output[0].status == "completed"


def test_the_stream_is_typed_events_in_order_and_its_final_response(server: RunningServer, ending: dict) -> None:
    with server.client().responses.stream(model=MODEL, input=QUESTION, temperature=0, extra_body=ending) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    num_deltas = kinds.count("response.output_text.delta")
    assert num_deltas >= 1 and kinds == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * num_deltas, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    in_full = server.client().responses.create(model=MODEL, input=QUESTION, temperature=0, extra_body=ending)
    assert final.status == "completed" and final.output_text == deltas == in_full.output_text
    assert final.id == events[0].response.id and final.usage.output_tokens == 5


def test_raw_events_are_named_and_no_done_follows(server: RunningServer) -> None:
    body = {**GREEDY, "input": QUESTION, "stream": True}
    with server.http() as http, http.stream("POST", "/v1/responses", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(iter_typed_events(response.iter_lines()))
    assert all(name == data["type"] for name, data in events)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_parse_with_a_text_format(server: RunningServer) -> None:
    response = server.client().responses.parse(model=MODEL, input=QUESTION, text_format=Forecast, temperature=0,
                                               max_output_tokens=FORCED_MAX_TOKENS)
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Forecast)
    assert response.text.format.type == "json_schema" and response.text.format.name == "Forecast"


def test_a_function_tool_round_trip(server: RunningServer) -> None:
    client = server.client()
    question = [{"role": "user", "content": QUESTION}]
    first = client.responses.create(model=MODEL, input=question, tools=[WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=FORCED_MAX_TOKENS, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    args = Forecast.model_validate_json(call.arguments)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": f"{args.city}: sunny"}
    second = client.responses.create(model=MODEL, input=[*question, *first.output, result], tools=[WEATHER],
                                     max_output_tokens=8, temperature=0)
    assert second.output[0].type == "message" and second.output_text
    # The call and its result went through the chat template as chat's would.
    history = [*question, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result["output"]}]
    chat = chat_answer(server, history, tools=[CHAT_WEATHER])
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content


def test_a_streamed_call_arrives_as_argument_deltas(server: RunningServer) -> None:
    with server.client().responses.stream(model=MODEL, input=QUESTION, tools=[WEATHER], temperature=0,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=FORCED_MAX_TOKENS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    pieces = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    call = final.output[0]
    assert call.type == "function_call" and call.arguments == pieces == events[-3].arguments
    Forecast.model_validate_json(pieces)


def test_previous_response_id_continues_the_conversation(server: RunningServer) -> None:
    client = server.client()
    first = client.responses.create(input="My name is Ada.", instructions="Be brief", **GREEDY)
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id and second.instructions is None
    conversation = [{"role": "user", "content": "My name is Ada."},  # instructions are not carried over
                    {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "What is my name?"}]
    chat = chat_answer(server, conversation)
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    third = client.responses.create(input="And again?", previous_response_id=second.id, **GREEDY)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_a_stored_response_reads_back_and_deletes(server: RunningServer) -> None:
    client = server.client()
    response = client.responses.create(input=QUESTION, metadata={"topic": "weather"}, user="u1", **GREEDY)
    again = client.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump() and again.metadata == {"topic": "weather"}
    client.responses.delete(response.id)
    for read in (lambda: client.responses.retrieve(response.id),
                 lambda: client.responses.create(input="x", previous_response_id=response.id, **GREEDY)):
        with pytest.raises(openai.NotFoundError):
            read()
    with server.http() as http:
        error = assert_error_shape(http.get(f"/v1/responses/{response.id}"), 404)
        assert response.id in error["message"] and error["param"] == "response_id"
        assert assert_error_shape(http.delete("/v1/responses/resp_nope"), 404)["code"] == "not_found"
        assert assert_error_shape(http.post("/v1/responses/resp_nope/cancel"), 404)["param"] == "response_id"
        missing = http.post("/v1/responses", json={**GREEDY, "input": "x", "previous_response_id": "resp_nope"})
        assert assert_error_shape(missing, 404)["param"] == "previous_response_id"
    unstored = client.responses.create(input=QUESTION, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_background_response_runs_on_and_is_read_back(server: RunningServer, ending: dict) -> None:
    client = server.client()
    started = client.responses.create(model=MODEL, input=QUESTION, background=True, extra_body=ending)
    assert started.status == "in_progress" and started.background
    deadline = time.monotonic() + 30
    while (done := client.responses.retrieve(started.id)).status == "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert done.status == "completed" and done.usage.output_tokens == 5 and done.output[0].type == "message"
    with pytest.raises(openai.BadRequestError):  # only background responses can be cancelled
        client.responses.cancel(client.responses.create(input="x", **GREEDY).id)


def test_cancel_stops_a_background_response_and_frees_its_blocks(server: RunningServer) -> None:
    client = server.client()
    started = client.responses.create(model=MODEL, input=QUESTION, background=True, max_output_tokens=1500,
                                      extra_body={"ignore_eos": True})
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and client.responses.retrieve(started.id).status == "cancelled"
    assert cancelled.usage is None
    assert server.wait_idle()["num_kv_blocks_used"] == 0
    assert client.responses.cancel(started.id).status == "cancelled"  # cancelling again changes nothing


def test_a_disconnect_mid_stream_frees_the_blocks(server: RunningServer) -> None:
    body = {"model": MODEL, "input": QUESTION, "stream": True, "max_output_tokens": 1500, "ignore_eos": True}
    with server.http() as http, http.stream("POST", "/v1/responses", json=body) as response:
        for name, _ in iter_typed_events(response.iter_lines()):
            if name == "response.output_text.delta":
                break
    assert server.wait_idle()["num_kv_blocks_used"] == 0


def test_a_disconnect_before_an_answer_in_full_frees_the_blocks(server: RunningServer) -> None:
    body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout), server.http() as http:
        http.post("/v1/responses", json=body, timeout=0.5)
    assert server.wait_idle()["num_kv_blocks_used"] == 0


def test_logprobs_when_included(server: RunningServer) -> None:
    response = server.client().responses.create(input=QUESTION, include=["message.output_text.logprobs"],
                                                top_logprobs=2, **GREEDY)
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == 8 and all(len(entry.top_logprobs) == 2 for entry in logprobs)
    assert all(entry.logprob >= entry.top_logprobs[0].logprob - 1e-6 for entry in logprobs)  # greedy picks the top


def test_bad_requests_are_400s_naming_the_field_and_unknown_fields_are_named(server: RunningServer) -> None:
    with server.http() as http:
        bad = http.post("/v1/responses", json={**GREEDY, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/x.png"}]}]})
        assert assert_error_shape(bad, 400)["param"] == "input[0].content[0].type"
        unknown_model = http.post("/v1/responses", json={**GREEDY, "model": "nope", "input": "x"})
        assert assert_error_shape(unknown_model, 404)["code"] == "model_not_found"
        tolerated = http.post("/v1/responses", json={**GREEDY, "input": "x", "mood": "sunny"})
        assert tolerated.status_code == 200 and tolerated.headers["x-ignored-fields"] == "mood"
    assert server.wait_idle()["num_kv_blocks_used"] == 0


def test_openai_agents_default_model_runs_an_agent_with_a_function_tool(server: RunningServer, ending: dict) -> None:
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider

    set_tracing_disabled(True)  # no traces sent anywhere
    calls: list[tuple[str, bool]] = []

    @function_tool
    def get_weather(city: City, metric: bool) -> str:
        """Get the weather forecast for a city."""
        calls.append((city, metric))
        return f"{city}: sunny"

    provider = OpenAIProvider(openai_client=server.async_client())  # its models: the Responses API by default
    # Greedy, and every answer ends by itself (the runner takes an `incomplete` response for a failure):
    # the end-of-text token wins as soon as it may, which for the forced call is once its JSON is complete
    # (min_tokens does not go with structured output).
    end_now = {"logit_bias": ending["logit_bias"]}
    settings = ModelSettings(tool_choice="required", temperature=0, max_tokens=FORCED_MAX_TOKENS, extra_body=end_now)
    agent = Agent(name="forecaster", instructions="Answer questions about the weather.", tools=[get_weather],
                  model=MODEL, model_settings=settings)
    config = RunConfig(model_provider=provider)

    async def run_twice() -> list[object]:
        """In full, then streamed (the agent reads the typed event stream itself)."""
        in_full = await Runner.run(agent, QUESTION, max_turns=3, run_config=config)
        streamed = Runner.run_streamed(agent, QUESTION, max_turns=3, run_config=config)
        async for _ in streamed.stream_events():
            pass
        return [in_full, streamed]

    for result in asyncio.run(run_twice()):
        kinds = [item.type for item in result.new_items]  # type: ignore[attr-defined]
        assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"
        assert isinstance(result.final_output, str)  # type: ignore[attr-defined]  # after the tool ran, an answer
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0][0] in ("Paris", "Rome", "Oslo")


def test_input_items_of_a_string_input_are_one_user_message(server: RunningServer) -> None:
    client = server.client()
    response = client.responses.create(input=QUESTION, instructions="Be brief", **GREEDY)
    items = client.responses.input_items.list(response.id)
    assert len(items.data) == 1 and items.has_more is False  # instructions are not input items
    message = items.data[0]
    assert message.type == "message" and message.role == "user" and message.id.startswith("msg_")
    assert [(part.type, part.text) for part in message.content] == [("input_text", QUESTION)]
    assert client.responses.input_items.list(response.id).data[0].id == message.id  # ids are kept


def test_input_items_are_the_items_sent_with_ids_newest_first(server: RunningServer) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    sent = [{"role": "developer", "content": "Be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
            {"type": "message", "role": "assistant", "id": "msg_given", "content": "Let me look."}, call,
            {"type": "function_call_output", "call_id": "call_1", "output": "Oslo: rain"}]
    client = server.client()
    response = client.responses.create(input=sent, instructions="Answer in French", tools=[WEATHER], **GREEDY)
    items = list(reversed(client.responses.input_items.list(response.id).data))  # newest first by default
    assert [item.type for item in items] == ["message", "message", "message", "function_call", "function_call_output"]
    assert [getattr(item, "role", None) for item in items[:3]] == ["developer", "user", "assistant"]
    assert items[0].content[0].type == "input_text" and items[0].content[0].text == "Be brief"
    assert items[2].id == "msg_given" and items[2].content[0].type == "output_text"
    assert items[2].content[0].text == "Let me look." and items[2].content[0].annotations == []
    assert (items[3].call_id, items[3].name, items[3].arguments) == ("call_1", "get_weather", call["arguments"])
    assert items[4].call_id == "call_1" and items[4].output == "Oslo: rain"
    assert len({item.id for item in items}) == 5 and all(item.status == "completed" for item in items)


def test_input_items_of_a_continued_response_are_its_own_input(server: RunningServer) -> None:
    client = server.client()
    first = client.responses.create(input="My name is Ada.", **GREEDY)
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, **GREEDY)
    items = client.responses.input_items.list(second.id).data
    assert [part.text for item in items for part in item.content] == ["What is my name?"]


def test_input_items_page_with_limit_after_before_and_order(server: RunningServer) -> None:
    client = server.client()
    texts = [f"Line {i}" for i in range(5)]
    response = client.responses.create(input=[{"role": "user", "content": text} for text in texts], **GREEDY)
    first = client.responses.input_items.list(response.id, limit=2, order="asc")
    assert [item.content[0].text for item in first.data] == texts[:2] and first.has_more
    # The SDK pages on with `after` (the last id) until has_more is false.
    assert [item.content[0].text for item in first] == texts
    newest = client.responses.input_items.list(response.id, limit=3)
    assert [item.content[0].text for item in newest.data] == texts[:1:-1]
    ids = [item.id for item in client.responses.input_items.list(response.id, order="asc").data]
    with server.http() as http:
        path = f"/v1/responses/{response.id}/input_items"
        page = http.get(path, params={"order": "asc", "after": ids[1], "limit": 2}).json()
        assert page["object"] == "list" and [item["id"] for item in page["data"]] == ids[2:4]
        assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[2], ids[3], True)
        before = http.get(path, params={"order": "asc", "before": ids[3], "limit": 2}).json()
        assert [item["id"] for item in before["data"]] == ids[1:3] and before["has_more"]
        last = http.get(path, params={"after": ids[1]}).json()  # desc: what follows is older
        assert [item["id"] for item in last["data"]] == [ids[0]] and not last["has_more"]
        for params, param in [({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"limit": "x"}, "limit"),
                              ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after"),
                              ({"include[]": "bogus.field"}, "include")]:
            assert assert_error_shape(http.get(path, params=params), 400)["param"] == param
    included = client.responses.input_items.list(response.id, include=["message.output_text.logprobs"])
    assert len(included.data) == 5


def test_input_items_of_an_unknown_unstored_or_deleted_response_are_a_404(server: RunningServer) -> None:
    client = server.client()
    unstored = client.responses.create(input=QUESTION, store=False, **GREEDY)
    deleted = client.responses.create(input=QUESTION, **GREEDY)
    client.responses.delete(deleted.id)
    with server.http() as http:
        for response_id in ("resp_nope", unstored.id, deleted.id):
            error = assert_error_shape(http.get(f"/v1/responses/{response_id}/input_items"), 404)
            assert error["param"] == "response_id" and error["code"] == "not_found" and response_id in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(deleted.id)
