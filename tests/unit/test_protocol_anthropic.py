"""POST /v1/messages bodies without a server: what they become (the chat request they run as, rendered
as chat renders the same conversation), and 400s that name the field."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from core.tiny_model import build_tiny_model
from openai_serve.chat_template import ChatTemplate
from openai_serve.errors import APIError
from openai_serve.protocol.anthropic_input import BILLING_HEADER
from openai_serve.protocol.anthropic_request import parse_count_tokens_request, parse_messages_request
from openai_serve.protocol.chat import parse_chat_request
from openai_serve.protocol.fields import UnknownFields
from openai_serve.protocol.tools import ToolChoice
from tests.chat_templates import HERMES_TOOLS_TEMPLATE

RECORDED = Path(__file__).parents[1] / "data" / "claude_code" / "messages_request.json"
A = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"name": "get_weather", "description": "Weather", "input_schema": CITY}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]}


def error_of(body: object) -> APIError:
    with pytest.raises(APIError) as err:
        parse_messages_request(body)
    assert err.value.status_code == 400, err.value.message
    return err.value


def with_messages(*messages: dict) -> dict:
    return A | {"messages": list(messages)}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> ChatTemplate:
    directory = build_tiny_model(tmp_path_factory.mktemp("anthropic-template-model"))
    return ChatTemplate(AutoTokenizer.from_pretrained(Path(directory)), HERMES_TOOLS_TEMPLATE)


def test_system_blocks_and_text_blocks_become_chats_messages() -> None:
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.2.3.abc; cc_entrypoint=cli;"},
              {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Answer in French."}]
    user = {"role": "user", "content": [{"type": "text", "text": "Weather"},
                                        {"type": "text", "text": "in Paris?", "cache_control": {"type": "ephemeral"}}]}
    request = parse_messages_request(A | {"system": system, "messages": [user]})
    assert request.messages == ({"role": "system", "content": "Be brief.\nAnswer in French."},
                                {"role": "user", "content": "Weather\nin Paris?"})
    assert request.add_generation_prompt and not request.continue_final_message
    assert request.max_tokens == 16 and request.requested_max_tokens == 16 and request.tools.choice is ToolChoice.NONE


def test_a_tool_round_trip_is_chats_conversation(template: ChatTemplate) -> None:
    """An assistant's thinking, text and tool_use, then the user's tool_result and text, render as the same
    conversation in chat's shape (assistant tool_calls, a tool message) does."""
    assistant = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Look it up.", "signature": "abc"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Let me check."}, TOOL_USE]}
    user = {"role": "user", "content": [TOOL_RESULT, {"type": "text", "text": "Thanks"}]}
    request = parse_messages_request(with_messages({"role": "user", "content": "Weather?"}, assistant, user)
                                     | {"tools": [TOOL]})
    chat = parse_chat_request({"model": "m", "tools": [CHAT_TOOL], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "user", "content": "Thanks"}]})
    assert request.messages == chat.messages
    assert request.tools.choice is ToolChoice.AUTO and request.tools.template_tools() == [CHAT_TOOL]
    prompt = template.render(request)
    assert prompt == template.render(chat) and "<tool_response>\n18 C\n</tool_response>" in prompt


def test_an_error_result_says_so_and_a_string_result_is_its_content() -> None:
    results = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": True},
               {"type": "tool_result", "tool_use_id": "toolu_2", "content": "18 C"},
               {"type": "tool_result", "tool_use_id": "toolu_3"}]
    request = parse_messages_request(with_messages({"role": "user", "content": results}))
    assert request.messages == ({"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such city"},
                                {"role": "tool", "tool_call_id": "toolu_2", "content": "18 C"},
                                {"role": "tool", "tool_call_id": "toolu_3", "content": ""})


def test_consecutive_turns_of_one_role_are_one_and_a_mid_conversation_system_message_stays() -> None:
    request = parse_messages_request(with_messages(
        {"role": "user", "content": "one"}, {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]}, {"role": "user", "content": "three"}))
    assert request.messages == ({"role": "user", "content": "one\ntwo"}, {"role": "system", "content": "Be brief."},
                                {"role": "assistant", "content": "a\nb"}, {"role": "user", "content": "three"})


def test_a_last_assistant_message_is_continued() -> None:
    request = parse_messages_request(with_messages({"role": "user", "content": "Pick one"},
                                                   {"role": "assistant", "content": "The answer is ("}))
    assert request.continue_final_message and not request.add_generation_prompt
    assert request.messages[-1] == {"role": "assistant", "content": "The answer is ("}


def test_sampling_fields_and_stop_sequences() -> None:
    request = parse_messages_request(A | {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "stop_sequences": ["END"],
                                          "stop": ["HALT"], "seed": 3, "stream": True})
    sampling = request.common.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (0.5, 0.9, 5, 3)
    assert sampling.stop == ("HALT", "END") and sampling.max_tokens == 16 and request.common.stream.stream


@pytest.mark.parametrize(("choice", "expected", "named", "parallel"), [
    ({"type": "auto"}, ToolChoice.AUTO, None, True),
    ({"type": "any", "disable_parallel_tool_use": True}, ToolChoice.REQUIRED, None, False),
    ({"type": "tool", "name": "get_weather"}, ToolChoice.NAMED, "get_weather", True),
    ({"type": "none"}, ToolChoice.NONE, None, True),
])
def test_tool_choices_are_chats(choice: dict, expected: ToolChoice, named: str | None, parallel: bool) -> None:
    request = parse_messages_request(A | {"tools": [TOOL], "tool_choice": choice})
    assert request.tools.choice is expected and request.tools.named == named
    assert request.tools.parallel_tool_calls is parallel
    structured = request.common.sampling.structured_output
    assert (structured is not None) == (expected in (ToolChoice.REQUIRED, ToolChoice.NAMED))
    if structured is not None:
        assert structured.param == "tool_choice"


@pytest.mark.parametrize(("thinking", "enable_thinking", "shows"), [
    ({"type": "enabled", "budget_tokens": 1024}, True, True), ({"type": "disabled"}, False, True),
    ({"type": "adaptive"}, None, True), ({"type": "adaptive", "display": "omitted"}, None, False),
])
def test_thinking_is_the_templates_switch(thinking: dict, enable_thinking: bool | None, shows: bool) -> None:
    request = parse_messages_request(A | {"max_tokens": 2048, "thinking": thinking,
                                          "output_config": {"effort": "high"}})
    assert request.template_kwargs.get("enable_thinking") == enable_thinking
    assert request.template_kwargs["reasoning_effort"] == "high" and request.shows_thinking is shows


def test_output_config_format_is_structured_output() -> None:
    request = parse_messages_request(A | {"output_config": {"format": {"type": "json_schema", "schema": CITY}}})
    structured = request.common.sampling.structured_output
    assert structured is not None and structured.param == "output_config.format"
    assert '"city"' in (structured.json_schema or "")


def test_max_tokens_is_cut_to_what_the_context_leaves() -> None:
    request = parse_messages_request(A | {"max_tokens": 32000})
    assert request.within_context(100, 2048).max_tokens == 1948
    assert request.within_context(100, 2048).requested_max_tokens == 32000
    assert request.within_context(100, 64000).max_tokens == 32000
    with pytest.raises(APIError, match=r"^prompt is too long: 2048 tokens > 2047 maximum") as too_long:
        request.within_context(2048, 2048)  # Anthropic's words, which Claude Code reads to compact
    assert too_long.value.param == "messages"
    with pytest.raises(APIError) as no_room:
        parse_messages_request(A | {"min_tokens": 8}).within_context(2044, 2048)
    assert no_room.value.status_code == 400 and no_room.value.param == "min_tokens"


def test_what_claude_code_sent_is_read_with_nothing_left_over() -> None:
    """Its recorded request (tests/e2e/test_claude_code.py says how it was made), read as strictly as
    --strict-request-fields reads: every field is known, and its billing block is dropped."""
    body = json.loads(RECORDED.read_text())["body"]
    request = parse_messages_request(body, UnknownFields(is_strict=True))
    assert [message["role"] for message in request.messages] == ["system", "user", "system"]
    assert not any(BILLING_HEADER in str(message["content"]) for message in request.messages)
    assert [tool.name for tool in request.tools.tools] == ["Agent", "Read"] and request.tools.choice is ToolChoice.AUTO
    assert request.template_kwargs == {"reasoning_effort": "high"} and request.common.stream.stream
    assert request.requested_max_tokens == 64 and request.ignored_fields == ()


def test_unknown_fields_are_named_or_refused_when_strict() -> None:
    body = A | {"mood": "calm", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]}
    assert parse_messages_request(body, UnknownFields()).ignored_fields == ("messages[0].content[0].x", "mood")
    assert error_of(body).param == "messages[0].content[0].x"


def test_count_tokens_reads_the_same_prompt() -> None:
    body = A | {"system": "Be brief.", "tools": [TOOL], "thinking": {"type": "disabled"}}
    counted = parse_count_tokens_request({key: value for key, value in body.items() if key != "max_tokens"})
    created = parse_messages_request(body)
    assert counted.messages == created.messages and counted.tools == created.tools
    assert counted.template_kwargs == created.template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(("change", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": "16"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": None}, "model"),
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [TOOL_USE]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [TOOL_USE | {"input": "x"}]}]}, "messages[0].content[0].input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"system": 5}, "system"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_p": "high"}, "top_p"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"stream": "yes"}, "stream"),
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"tools": [TOOL], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "on"}}, "thinking.type"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),  # not below max_tokens
    ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
    ({"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024}, "tools": [TOOL],
      "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({"output_config": {"format": {"type": "json_schema", "schema": CITY}}, "response_format": {
        "type": "json_object"}}, "output_config.format"),
    ({"metadata": {"user_id": 5}}, "metadata.user_id"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management.edits[0].type"),
    ({"container": "c_1"}, "container"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
])
def test_bad_bodies_are_400s_naming_the_field(change: dict, param: str) -> None:
    body = {key: value for key, value in (A | change).items() if value is not None}
    error = error_of(body)
    assert error.param == param and param.split("[")[0].split(".")[0] in error.message
