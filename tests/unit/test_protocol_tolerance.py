"""Tolerant where clients are sloppy, strict where values matter: unknown fields, what SDKs send back
as history, OpenAI's local-meaningless fields, and tools / tool_choice as typed values."""

import json

import jsonschema
import pytest

from openai_serve.errors import APIError
from openai_serve.protocol.chat import parse_chat_request
from openai_serve.protocol.completions import parse_completion_request
from openai_serve.protocol.fields import UnknownFields
from openai_serve.protocol.tools import ToolChoice, forced_schema

M = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer"}}, "required": ["n"]}}}
G = {"type": "function", "function": {"name": "g"}}


def lenient(body: dict) -> tuple[str, ...]:
    return parse_chat_request(body, UnknownFields()).ignored_fields


def test_unknown_fields_are_collected_or_a_400():
    body = M | {"num_ctx": 2048, "repeat_penalty": 1.1,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}], "mood": 2}]}
    assert sorted(lenient(body)) == ["messages[0].content[0].extra", "messages[0].mood", "num_ctx", "repeat_penalty"]
    with pytest.raises(APIError) as err:
        parse_chat_request(M | {"num_ctx": 2048}, UnknownFields(is_strict=True))
    assert err.value.param == "num_ctx" and "Unrecognized" in err.value.message
    assert parse_completion_request({"model": "m", "prompt": "x", "mirostat": 0}, UnknownFields()).ignored_fields == (
        "mirostat",)


def test_known_fields_are_still_checked_when_unknown_ones_are_ignored():
    with pytest.raises(APIError) as err:
        parse_chat_request(M | {"num_ctx": 1, "temperature": "hot"}, UnknownFields())
    assert err.value.param == "temperature"


def test_openai_fields_that_mean_nothing_here_are_accepted():
    body = M | {"store": True, "metadata": {"k": "v"}, "service_tier": "flex", "prediction": {"type": "content",
                "content": "x"}, "user": "u", "safety_identifier": "s", "prompt_cache_key": "k", "parallel_tool_calls":
                False, "verbosity": "low"}
    assert lenient(body) == ()


def test_a_sdk_reply_goes_back_as_history():
    reply = {"role": "assistant", "content": "Hello", "refusal": None, "annotations": [], "audio": None,
             "function_call": None, "tool_calls": None, "reasoning_content": "hm"}
    body = M | {"messages": [*M["messages"], reply, {"role": "user", "content": [
        {"type": "text", "text": "again", "cache_control": {"type": "ephemeral"}}]}]}
    request = parse_chat_request(body)
    assert request.messages[1] == {"role": "assistant", "content": "Hello", "reasoning_content": "hm"}
    assert request.messages[2] == {"role": "user", "content": "again"}


def test_a_refusal_is_the_content_of_a_message_without_one():
    body = M | {"messages": [{"role": "assistant", "content": None, "refusal": "I can't."}]}
    assert parse_chat_request(body).messages[0]["content"] == "I can't."


def test_images_are_still_a_400():
    body = M | {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    with pytest.raises(APIError) as err:
        parse_chat_request(body, UnknownFields())
    assert err.value.param == "messages[0].content[0].type"


def test_tool_calls_in_history_have_object_arguments_for_the_template():
    call = {"id": "c1", "type": "function", "index": 0, "function": {"name": "f", "arguments": '{"n": 1}'}}
    odd = {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    messages = parse_chat_request(M | {"messages": [{"role": "assistant", "tool_calls": [call, odd]}]}).messages
    assert messages[0]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"n": 1}}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "not json"}},
    ]


def test_tool_choice_defaults_as_openai():
    assert parse_chat_request(M | {"tools": [F]}).tools.choice is ToolChoice.AUTO
    assert parse_chat_request(M).tools.choice is ToolChoice.NONE
    assert parse_chat_request(M | {"tool_choice": "auto"}).tools.choice is ToolChoice.NONE  # no tools: nothing to call
    named = parse_chat_request(M | {"tools": [F, G], "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert (named.tools.choice, named.tools.named) == (ToolChoice.NAMED, "g")


def test_two_tools_of_one_name_are_a_400():
    with pytest.raises(APIError) as err:
        parse_chat_request(M | {"tools": [F, F]})
    assert err.value.param == "tools"


def test_a_named_choice_is_forced_to_the_tools_parameters():
    tools = parse_chat_request(M | {"tools": [F, G], "tool_choice": {"type": "function", "function": {"name": "f"}}})
    schema = json.loads(forced_schema(tools.tools))
    jsonschema.validate({"n": 3}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"n": "three"}, schema)
    g_only = parse_chat_request(M | {"tools": [G], "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert json.loads(forced_schema(g_only.tools)) == {"type": "object"}


@pytest.mark.parametrize("parallel", [True, False])
def test_required_is_an_array_of_calls_of_the_tools(parallel: bool):
    tools = parse_chat_request(M | {"tools": [F, G], "tool_choice": "required", "parallel_tool_calls": parallel}).tools
    schema = json.loads(forced_schema(tools))
    two_calls = [{"name": "f", "parameters": {"n": 1}}, {"name": "g", "parameters": {}}]
    jsonschema.validate(two_calls[:1], schema)
    for bad in ([], [{"name": "h", "parameters": {}}], [{"name": "f", "parameters": {"n": "x"}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    if parallel:
        jsonschema.validate(two_calls, schema)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(two_calls, schema)
    assert forced_schema(parse_chat_request(M | {"tools": [F]}).tools) is None  # auto: nothing forced
