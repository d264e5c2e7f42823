"""POST /v1/responses bodies without a server: what they become (the chat request they run as, the
template's prompt, equal to chat's for the same conversation), and 400s that name the field."""

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from core.tiny_model import build_tiny_model
from openai_serve.chat_template import ChatTemplate
from openai_serve.errors import APIError
from openai_serve.protocol.chat import parse_chat_request
from openai_serve.protocol.fields import UnknownFields
from openai_serve.protocol.responses import parse_responses_request
from openai_serve.protocol.tools import ToolChoice
from tests.chat_templates import HERMES_TOOLS_TEMPLATE

R = {"model": "m", "input": "hi"}
M = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FLAT_TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": CITY}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
        "arguments": '{"city": "Paris"}', "status": "completed"}
RESULT = {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}


def param_of(body: object) -> str | None:
    with pytest.raises(APIError) as err:
        parse_responses_request(body)
    assert err.value.status_code == 400, err.value.message
    return err.value.param


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> ChatTemplate:
    directory = build_tiny_model(tmp_path_factory.mktemp("responses-template-model"))
    return ChatTemplate(AutoTokenizer.from_pretrained(Path(directory)), HERMES_TOOLS_TEMPLATE)


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    request = parse_responses_request(R | {"instructions": "Be brief", "max_output_tokens": 7, "temperature": 0.5})
    assert request.messages == ({"role": "system", "content": "Be brief"}, {"role": "user", "content": "hi"})
    assert request.conversation == ({"role": "user", "content": "hi"},)
    assert request.max_tokens == 7 and request.common.sampling.temperature == 0.5 and request.common.n == 1
    assert request.store and not request.background and not request.common.stream.stream
    assert request.settings["instructions"] == "Be brief" and request.settings["max_output_tokens"] == 7


def test_items_of_one_assistant_turn_become_one_message_and_results_tool_messages() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "think"}]}
    answer = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "phase": None,
              "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]}
    user = {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}
    request = parse_responses_request(R | {"input": [user, reasoning, answer, CALL, RESULT]})
    assert request.messages == (
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "think",
         "tool_calls": [{"type": "function", "id": "call_1",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    )


def test_an_item_that_goes_back_to_an_earlier_stage_starts_a_new_assistant_turn() -> None:
    said = {"role": "assistant", "content": "first"}
    request = parse_responses_request(R | {"input": [CALL, said, {"role": "developer", "content": "rule"}]})
    roles = [(m["role"], m["content"]) for m in request.messages]
    assert roles == [("assistant", ""), ("assistant", "first"), ("system", "rule")]


def test_a_tool_round_trip_renders_as_the_same_prompt_as_chat(template: ChatTemplate) -> None:
    question = "What is the weather in Paris?"
    responses = parse_responses_request({
        "model": "m", "instructions": "Be brief", "tools": [FLAT_TOOL], "reasoning": {"effort": "low"},
        "input": [{"role": "user", "content": question}, CALL, RESULT]})
    chat = parse_chat_request({"model": "m", "tools": [CHAT_TOOL], "reasoning_effort": "low", "messages": [
        {"role": "system", "content": "Be brief"}, {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})
    prompt = template.render(responses)
    assert prompt == template.render(chat)
    assert '"name": "get_weather"' in prompt and "Reasoning effort: low" in prompt and "18 C" in prompt


def test_history_goes_between_the_instructions_and_the_input() -> None:
    history = ({"role": "user", "content": "before"}, {"role": "assistant", "content": "answer"})
    request = parse_responses_request(R | {"instructions": "new rules"}).with_history(history)
    assert [m["content"] for m in request.messages] == ["new rules", "before", "answer", "hi"]
    assert request.conversation == (*history, {"role": "user", "content": "hi"})


def test_flat_tools_and_a_named_choice_read_as_chat_reads_its_own() -> None:
    request = parse_responses_request(R | {"tools": [FLAT_TOOL], "tool_choice": {"type": "function",
                                                                                 "name": "get_weather"},
                                           "parallel_tool_calls": False})
    tools = request.tools
    assert tools.choice is ToolChoice.NAMED and tools.named == "get_weather" and not tools.parallel_tool_calls
    assert tools.template_tools() == [CHAT_TOOL]
    assert request.settings["tools"] == [FLAT_TOOL] and request.settings["tool_choice"]["name"] == "get_weather"
    assert parse_responses_request(R | {"tools": [FLAT_TOOL]}).tools.choice is ToolChoice.AUTO


def test_a_forced_choice_is_structured_output_as_on_chat() -> None:
    named = {"type": "function", "name": "get_weather"}
    request = parse_responses_request(R | {"tools": [FLAT_TOOL], "tool_choice": named})
    chat = parse_chat_request(M | {"tools": [CHAT_TOOL], "tool_choice": {"type": "function",
                                                                           "function": {"name": "get_weather"}}})
    forced = request.common.sampling.structured_output
    assert forced == chat.common.sampling.structured_output and forced.param == "tool_choice"  # type: ignore[union-attr]
    with pytest.raises(APIError, match="text.format") as err:
        parse_responses_request(R | {"tools": [FLAT_TOOL], "tool_choice": "required",
                                     "text": {"format": {"type": "json_object"}}})
    assert err.value.param == "tool_choice"


def test_reasoning_effort_and_verbosity_are_template_variables() -> None:
    request = parse_responses_request(R | {"reasoning": {"effort": "high", "summary": "auto"},
                                           "text": {"verbosity": "low"}})
    assert request.template_kwargs == {"reasoning_effort": "high", "verbosity": "low"}
    assert request.settings["reasoning"] == {"effort": "high", "summary": "auto"}


def test_text_format_is_structured_output_as_response_format_is() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    flat = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    request = parse_responses_request(R | {"text": {"format": flat}})
    chat = parse_chat_request(M | {"response_format": {"type": "json_schema", "json_schema": {"name": "answer",
                                                                                              "schema": schema}}})
    assert request.common.sampling.structured_output == chat.common.sampling.structured_output
    assert request.common.sampling.structured_output.param == "text.format"  # type: ignore[union-attr]
    assert request.settings["text"]["format"] == flat
    as_object = parse_responses_request(R | {"text": {"format": {"type": "json_object"}}})
    assert as_object.common.sampling.structured_output.json_object  # type: ignore[union-attr]
    assert parse_responses_request(R | {"text": {"format": {"type": "text"}}}).common.sampling.structured_output is None


def test_logprobs_only_when_included() -> None:
    assert parse_responses_request(R | {"top_logprobs": 3}).logprobs is None
    included = parse_responses_request(R | {"include": ["message.output_text.logprobs"], "top_logprobs": 3})
    assert included.logprobs == 3


def test_openai_fields_of_no_meaning_here_are_accepted() -> None:
    body = R | {"store": False, "metadata": {"k": "v"}, "user": "u", "service_tier": "auto", "truncation": "auto",
                "prompt_cache_key": "p", "safety_identifier": "s", "include": ["reasoning.encrypted_content"],
                "max_tool_calls": 3, "stream": True, "stream_options": {"include_obfuscation": False},
                "background": None, "context_management": []}
    request = parse_responses_request(body)
    assert not request.store and request.metadata == {"k": "v"} and request.common.user == "u"


def test_unknown_fields_are_named_and_kept_out() -> None:
    unknown = UnknownFields()
    request = parse_responses_request(R | {"mood": 1, "input": [{"role": "user", "content": "x", "tone": 2}]},
                                      unknown)
    assert request.ignored_fields == ("input[0].tone", "mood")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    (R | {"input": []}, "input"),
    (R | {"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    (R | {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0].type"),
    (R | {"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type"),
    (R | {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    (R | {"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    (R | {"max_output_tokens": 0}, "max_output_tokens"),
    (R | {"temperature": -1}, "temperature"),
    (R | {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    (R | {"tools": [{"type": "function", "name": ""}]}, "tools[0].name"),
    (R | {"tools": [FLAT_TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
    (R | {"tools": [FLAT_TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
     "tool_choice.type"),
    (R | {"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    (R | {"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    (R | {"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a+"}}, "text.format"),
    (R | {"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    (R | {"reasoning": {"summary": "long"}}, "reasoning.summary"),
    (R | {"text": {"verbosity": "loud"}}, "text.verbosity"),
    (R | {"metadata": {"k": 1}}, "metadata"),
    (R | {"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    (R | {"store": False, "background": True}, "background"),
    (R | {"truncation": "middle"}, "truncation"),
    (R | {"prompt": {"id": "pmpt_1"}}, "prompt"),
    (R | {"conversation": "conv_1"}, "conversation"),
    (R | {"stream_options": {"include_obfuscation": True}}, "stream_options"),
    (R | {"include": "message.output_text.logprobs"}, "include"),
    (R | {"include": ["message.output_text.logprob"]}, "include"),  # not one of OpenAI's values
])
def test_bad_fields_are_400s_naming_them(body: dict, param: str) -> None:
    assert param_of(body) == param
