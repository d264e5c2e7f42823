"""Content blocks of an Anthropic message built from parsed parts: the events of each block in order,
and the message in full equal to what the official SDK accumulates from those events."""

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event

from openai_serve.anthropic_blocks import ContentBlocks, thinking_signature
from openai_serve.errors import APIError, is_anthropic_path
from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta

THINKING_TEXT_AND_CALLS = [
    [MessageDelta(reasoning="Let me "), MessageDelta(reasoning="think.")],
    [MessageDelta(content="Checking."), MessageDelta(tool_call=ToolCallDelta(0, "call_a", "get_weather"))],
    [MessageDelta(tool_call=ToolCallDelta(0, arguments='{"city": ')), MessageDelta(tool_call=ToolCallDelta(
        0, arguments='"Paris"}'))],
    [MessageDelta(tool_call=ToolCallDelta(1, "call_b", "get_time", '{"zone": "CET"}'))],
]


def build(wake_ups: list[list[MessageDelta]], shows_thinking: bool = True) -> tuple[ContentBlocks, list[dict]]:
    blocks = ContentBlocks(shows_thinking)
    events = [event for parts in wake_ups for event in blocks.add(parts)]
    return blocks, events + blocks.finish()


def kinds(events: list[dict]) -> list[tuple[str, int, str]]:
    """(event type, block index, the start's block type or the delta's type)."""
    return [(e["type"], e["index"], e["content_block"]["type"] if "content_block" in e else e.get("delta", {}).get(
        "type", "")) for e in events]


def test_each_block_starts_grows_and_stops_in_the_order_written() -> None:
    blocks, events = build(THINKING_TEXT_AND_CALLS)
    assert kinds(events) == [
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, ""),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, ""),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, ""),
        ("content_block_start", 3, "tool_use"), ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, "")]
    thinking, text, weather, time = blocks.items
    signature = thinking_signature("Let me think.")
    assert thinking == {"type": "thinking", "thinking": "Let me think.", "signature": signature}
    assert text == {"type": "text", "text": "Checking."}
    assert weather["name"] == "get_weather" and weather["input"] == {"city": "Paris"}
    assert time["name"] == "get_time" and time["input"] == {"zone": "CET"}
    assert weather["id"].startswith("toolu_") and len(weather["id"]) == 30 and weather["id"] != time["id"]
    assert blocks.has_tool_use


def test_the_sdk_accumulates_the_events_into_the_message_in_full() -> None:
    blocks, events = build(THINKING_TEXT_AND_CALLS)
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                                  "content": [], "stop_reason": None, "stop_sequence": None,
                                                  "usage": {"input_tokens": 3, "output_tokens": 0}}}
    snapshot, json_bufs = None, {}  # type: ignore[var-annotated]
    for event in [start, *events]:
        snapshot = accumulate_event(event=orjson.loads(orjson.dumps(event)), current_snapshot=snapshot,
                                    json_bufs=json_bufs)
    assert snapshot is not None
    assert [block.to_dict(exclude_none=True) for block in snapshot.content] == blocks.items


def test_omitted_thinking_sends_its_signature_but_not_its_text() -> None:
    blocks, events = build(THINKING_TEXT_AND_CALLS[:2], shows_thinking=False)
    assert not any(e.get("delta", {}).get("type") == "thinking_delta" for e in events)
    assert blocks.items[0] == {"type": "thinking", "thinking": "", "signature": thinking_signature("Let me think.")}


def test_a_call_cut_off_has_no_input_in_full_but_its_pieces_streamed() -> None:
    cut = [[MessageDelta(tool_call=ToolCallDelta(0, "call_a", "get_weather", '{"city": "Pa'))]]
    blocks, events = build(cut)
    assert blocks.items[0]["input"] == {}
    assert events[1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Pa'}


def test_nothing_written_is_no_block() -> None:
    blocks, events = build([[]])
    assert blocks.items == [] and events == [] and not blocks.has_tool_use


@pytest.mark.parametrize(("status", "anthropic_status", "kind"), [
    (400, 400, "invalid_request_error"), (401, 401, "authentication_error"), (404, 404, "not_found_error"),
    (408, 408, "invalid_request_error"), (413, 413, "request_too_large"), (500, 500, "api_error"),
    (503, 529, "overloaded_error"),
])
def test_errors_on_the_messages_api_are_in_anthropics_shape(status: int, anthropic_status: int, kind: str) -> None:
    error = APIError(status, "it went wrong", param="max_tokens", code="x")
    response = error.to_response(is_anthropic=True)
    assert response.status_code == anthropic_status
    assert orjson.loads(response.body) == {"type": "error", "error": {"type": kind, "message": "it went wrong"}}
    assert error.to_response().status_code == status and orjson.loads(error.to_response().body) == error.to_dict()


def test_which_paths_are_anthropics() -> None:
    assert is_anthropic_path("/v1/messages") and is_anthropic_path("/v1/messages/count_tokens")
    assert not is_anthropic_path("/v1/messagesx") and not is_anthropic_path("/v1/chat/completions")
