"""The libraries people point at a local server, end to end against a real server on the tiny model:
tools and structured output through each of them, with the versions named in pyproject's `test`
extra (tests/clients-nodeps.txt for the three whose metadata pins an older openai or jiter).

The model is random, so a tool call is forced (tool_choice required or named, or the library's own
way of asking for one) and must then always validate against the tool's schema: structured output
enforces it. Schemas use enums, booleans and bounded integers so that a random model's answer ends
within the few tokens these tests allow.
"""

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.chat_templates import HERMES_TOOLS_TEMPLATE
from tests.e2e.serving import MODEL, RunningServer, server_config, start_server

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches a price list at import otherwise
MAX_TOKENS = 64
PARALLEL_MAX_TOKENS = 256  # several calls in one answer
# Any JSON object (json_object) may nest and run on with random weights: room to end, and a seed that does.
JSON_OBJECT_MAX_TOKENS = 200
QUESTION = "What is the weather in Paris for the next 3 days?"


City = Literal["Paris", "Rome", "Oslo"]


class Forecast(BaseModel):
    """A weather forecast."""

    city: City
    days: int = Field(ge=1, le=7)
    metric: bool


Days = Annotated[int, Field(ge=1, le=7)]


def get_weather(city: City, days: Days, metric: bool) -> str:
    """Get the weather forecast for a city.

    Args:
        city: the city
        days: how many days ahead (1 to 7)
        metric: Celsius rather than Fahrenheit
    """
    return f"{city}: sunny for {days} days"


WEATHER_PARAMETERS = Forecast.model_json_schema()
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                                 "parameters": WEATHER_PARAMETERS}}
NOW_PARAMETERS = {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"]}
NOW_TOOL = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": NOW_PARAMETERS}}


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    # Tool schemas in the prompt take hundreds of tokens of the tiny 512-token vocabulary.
    running = start_server(model_dir, server_config(chat_template=HERMES_TOOLS_TEMPLATE), max_model_len=2048)
    yield running
    running.stop()


def base_url(server: RunningServer) -> str:
    return server.base_url + "/v1"


def assert_valid_weather_args(arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, WEATHER_PARAMETERS)


# --- the official SDK ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_forced_calls_always_validate(server: RunningServer, seed: int) -> None:
    """Over many seeds (temperature 1): named and required choices give arguments that validate."""
    client = server.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    for tool_choice, parallel in ((named, True), ("required", False), ("required", True)):
        out = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER_TOOL, NOW_TOOL],
            tool_choice=tool_choice, parallel_tool_calls=parallel, seed=seed, max_tokens=PARALLEL_MAX_TOKENS)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", (tool_choice, choice)
        calls = choice.message.tool_calls
        assert choice.message.content is None and calls and (parallel or len(calls) == 1)
        for call in calls:
            assert call.id.startswith("call_") and call.function.name in ("get_weather", "now")
            schema = WEATHER_PARAMETERS if call.function.name == "get_weather" else NOW_PARAMETERS
            jsonschema.validate(json.loads(call.function.arguments), schema)
        assert len({call.id for call in calls}) == len(calls)


def test_streamed_tool_call_deltas_reassemble_to_the_call_in_full(server: RunningServer) -> None:
    client = server.client()
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER_TOOL, NOW_TOOL],
            "tool_choice": "required", "seed": 11, "max_tokens": PARALLEL_MAX_TOKENS}
    whole = client.chat.completions.create(**body).choices[0]
    calls: dict[int, dict] = {}
    first_deltas: dict[int, object] = {}
    finish_reasons = []
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            finish_reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or []:
                first_deltas.setdefault(delta.index, delta)
                call = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
                call["arguments"] += delta.function.arguments or ""
    assert [c.function.name for c in whole.message.tool_calls] == [c["name"] for c in calls.values()]
    assert [c.function.arguments for c in whole.message.tool_calls] == [c["arguments"] for c in calls.values()]
    for delta in first_deltas.values():  # each call opens with its id, type and name
        assert delta.id and delta.type == "function" and delta.function.name in ("get_weather", "now")
    assert finish_reasons[-1] == whole.finish_reason == "tool_calls"
    assert len(calls) > 1  # this seed makes several calls: their indexes keep them apart


def test_sdk_parse_returns_the_parsed_model(server: RunningServer) -> None:
    out = server.client().chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], response_format=Forecast,
        max_tokens=MAX_TOKENS, seed=1)
    assert isinstance(out.choices[0].message.parsed, Forecast)


# --- LangChain (langchain-openai) --------------------------------------------------------------


def chat_openai(server: RunningServer):  # noqa: ANN201 - a LangChain chat model
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=base_url(server), api_key="unused", max_tokens=MAX_TOKENS, seed=3,
                      max_retries=0)


@pytest.mark.parametrize("tool_choice", ["get_weather", "any"])
def test_langchain_bind_tools(server: RunningServer, tool_choice: str) -> None:
    message = chat_openai(server).bind_tools([get_weather], tool_choice=tool_choice).invoke(QUESTION)
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert_valid_weather_args(message.tool_calls[0]["args"])


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_with_structured_output(server: RunningServer, method: str) -> None:
    model = chat_openai(server).with_structured_output(Forecast, method=method)
    prompt = QUESTION + (" Answer in JSON." if method == "json_mode" else "")
    if method == "json_mode":  # any JSON object: the model need not write this schema's one
        raw = chat_openai(server).with_structured_output(None, method="json_mode").invoke(prompt)
        assert isinstance(raw, dict)
    else:
        assert isinstance(model.invoke(prompt), Forecast)


# --- pydantic-ai ------------------------------------------------------------------------------------


def test_pydantic_ai_output_type_and_a_tool(server: RunningServer) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url(server), api_key="unused"))
    agent = Agent(model, output_type=Forecast, tools=[get_weather], retries=3,
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, seed=5))
    result = agent.run_sync(QUESTION)
    assert isinstance(result.output, Forecast)


# --- instructor ---------------------------------------------------------------------------------------


class Note(BaseModel):
    """Any JSON object is one (JSON mode asks for a JSON object, not for this schema)."""

    model_config = ConfigDict(extra="allow")


@pytest.mark.parametrize(("mode", "response_model"), [("TOOLS", Forecast), ("JSON_SCHEMA", Forecast), ("JSON", Note)])
def test_instructor(server: RunningServer, mode: str, response_model: type[BaseModel]) -> None:
    """TOOLS forces a call of the model's schema; JSON_SCHEMA sends it as response_format; JSON asks
    only for a JSON object (the schema is in the prompt, which a random model cannot follow)."""
    import instructor

    client = instructor.from_openai(server.client(), mode=getattr(instructor.Mode, mode))
    answer = client.chat.completions.create(
        model=MODEL, response_model=response_model, messages=[{"role": "user", "content": QUESTION}],
        max_tokens=JSON_OBJECT_MAX_TOKENS, max_retries=0, seed=2)
    assert isinstance(answer, response_model)


# --- openai-agents ---------------------------------------------------------------------------------


def test_openai_agents_function_tool(server: RunningServer) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no traces sent anywhere
    calls = []

    @function_tool
    def weather(city: City, days: Days, metric: bool) -> str:
        """Get the weather forecast for a city."""
        calls.append((city, days, metric))
        return "sunny"

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=server.async_client())
    agent = Agent(name="forecaster", instructions="Answer questions about the weather.", tools=[weather], model=model,
                  model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS, extra_args={"seed": 4}))
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=4))
    assert calls and isinstance(result.final_output, str)  # the tool ran, then (tool_choice reset) it answered


# --- litellm ------------------------------------------------------------------------------------------


def test_litellm_tools(server: RunningServer) -> None:
    import litellm

    response = litellm.completion(
        model=f"openai/{MODEL}", api_base=base_url(server), api_key="unused",
        messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER_TOOL], tool_choice="required",
        parallel_tool_calls=False, max_tokens=PARALLEL_MAX_TOKENS, seed=6)
    calls = response.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert_valid_weather_args(calls[0].function.arguments)


# --- llama-index ----------------------------------------------------------------------------------------


def test_llama_index_chat_with_tools(server: RunningServer) -> None:
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model=MODEL, api_base=base_url(server), api_key="unused", is_chat_model=True,
                     is_function_calling_model=True, max_tokens=MAX_TOKENS, max_retries=0,
                     additional_kwargs={"seed": 8})
    tool = FunctionTool.from_defaults(fn=get_weather, fn_schema=Forecast)  # its own schema loses the bounds
    response = llm.chat_with_tools([tool], user_msg=QUESTION, tool_required=True)
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert calls[0].tool_name == "get_weather"
    jsonschema.validate(calls[0].tool_kwargs, tool.metadata.get_parameters_dict())
