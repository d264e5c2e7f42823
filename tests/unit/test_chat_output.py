"""Assistant message parts in OpenAI's JSON, and the X-Ignored-Fields header."""

from starlette.responses import Response

from openai_serve.chat_output import delta_json, finish_reason, message_json
from openai_serve.ignored_fields import HEADER, name_ignored_fields
from openai_serve.parsers.deltas import AssistantMessage, MessageDelta, ToolCall, ToolCallDelta


def test_a_delta_merges_its_parts_one_entry_per_call():
    parts = [MessageDelta(content="a"), MessageDelta(reasoning="r"), MessageDelta(content="b"),
             MessageDelta(tool_call=ToolCallDelta(0, "call_1", "f")), MessageDelta(tool_call=ToolCallDelta(0, None,
                                                                                                      None, '{"x"')),
             MessageDelta(tool_call=ToolCallDelta(1, "call_2", "g", "{}"))]
    assert delta_json(parts) == {
        "content": "ab", "reasoning_content": "r", "reasoning": "r",
        "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x"'}},
            {"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    }
    assert delta_json([MessageDelta(tool_call=ToolCallDelta(0, arguments=": 1}"))]) == {
        "tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}
    assert delta_json([]) == {}


def test_a_message_in_full():
    calls = AssistantMessage(tool_calls=[ToolCall("call_1", "f", "{}")])
    assert message_json(calls, has_reasoning=False) == {
        "role": "assistant", "content": None, "refusal": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert message_json(AssistantMessage(), has_reasoning=True) == {
        "role": "assistant", "content": "", "refusal": None, "reasoning_content": None, "reasoning": None}
    thought = message_json(AssistantMessage(reasoning="hm"), has_reasoning=True)
    assert thought["content"] is None and thought["reasoning"] == "hm"


def test_finish_reason():
    assert finish_reason("stop", True) == "tool_calls"
    assert finish_reason("length", True) == "length"
    assert finish_reason("stop", False) == "stop"


def test_the_header_is_printable_ascii_and_bounded():
    response = name_ignored_fields(Response(), ("a\r\nb", "é", *[f"f{i}" for i in range(40)]))
    value = response.headers[HEADER]
    assert value.startswith("a\\r\\nb, \\xe9, f0") and value.endswith(", and 10 more")
    assert HEADER not in name_ignored_fields(Response(), ()).headers
