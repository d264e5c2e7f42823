"""Tools, tool calls, tool replies, thinking and reasoning_effort reach the chat template."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from core.tiny_model import build_tiny_model
from openai_serve.chat_template import ChatTemplate
from openai_serve.parsers.selection import resolve_tool_call_parser
from openai_serve.protocol.chat import parse_chat_request
from tests.chat_templates import HERMES_TOOLS_TEMPLATE

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> ChatTemplate:
    directory = build_tiny_model(tmp_path_factory.mktemp("template-model"))
    return ChatTemplate(AutoTokenizer.from_pretrained(Path(directory)), HERMES_TOOLS_TEMPLATE)


def render(template: ChatTemplate, **body: object) -> str:
    return template.render(parse_chat_request({"model": "m", **body}))


def test_tools_reach_the_template(template: ChatTemplate):
    prompt = render(template, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER])
    assert json.dumps(WEATHER) in prompt and "<tool_call>" in prompt
    assert "<tools>" not in render(template, messages=[{"role": "user", "content": "hi"}])


def test_a_tool_call_and_its_reply_go_back_through_the_template(template: ChatTemplate):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None, "annotations": [],
         "audio": None, "function_call": None, "reasoning_content": "They want weather."},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    prompt = render(template, messages=messages, tools=[WEATHER])
    # the arguments reached the template as an object (tojson wrote JSON, not a quoted string)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert "<think>\nThey want weather.\n</think>" in prompt


def test_reasoning_effort_is_a_template_variable(template: ChatTemplate):
    messages = [{"role": "user", "content": "hi"}]
    assert "Reasoning effort: high" in render(template, messages=messages, reasoning_effort="high")
    assert "Reasoning effort" not in render(template, messages=messages)
    kwargs = {"chat_template_kwargs": {"reasoning_effort": "low"}}  # the explicit variable wins
    assert "Reasoning effort: low" in render(template, messages=messages, reasoning_effort="high", **kwargs)


def test_auto_tool_call_parser_from_the_template(template: ChatTemplate):
    assert resolve_tool_call_parser("auto", template.text) == "hermes"
    assert resolve_tool_call_parser("auto", "{{ messages }}") is None
    assert resolve_tool_call_parser("none", template.text) is None
    assert resolve_tool_call_parser("llama3_json", template.text) == "llama3_json"
