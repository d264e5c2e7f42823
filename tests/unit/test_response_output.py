"""Output items and their stream events from an answer's parts: the order of events per item, items
that close when a part of another kind comes, and a stream whose events add up to the items."""

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta
from openai_serve.response_output import OutputItems


def reasoning(text: str) -> MessageDelta:
    return MessageDelta(reasoning=text)


def content(text: str) -> MessageDelta:
    return MessageDelta(content=text)


def call(index: int, name: str | None = None, arguments: str = "") -> MessageDelta:
    call_id = None if name is None else f"call_{index}"
    return MessageDelta(tool_call=ToolCallDelta(index, call_id, name, arguments))


def replay(events: list[dict]) -> list[dict]:
    """The items as a client rebuilds them from the events alone (as the SDK's stream does)."""
    items: dict[int, dict] = {}
    for event in events:
        kind, index = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            items[index] = {**event["item"], "text": "", "arguments": event["item"].get("arguments", "")}
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            items[index]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[index]["arguments"] += event["delta"]
        elif kind == "response.output_item.done":
            assert event["item"]["id"] == items[index]["id"]
    return [items[i] for i in sorted(items)]


def test_reasoning_then_text_then_two_calls_in_order() -> None:
    output = OutputItems()
    events = output.add([reasoning("let me "), reasoning("see")])
    events += output.add([content("Checking."), call(0, "get_weather"), call(0, arguments='{"city": ')])
    events += output.add([call(0, arguments='"Paris"}'), call(1, "now", "{}")])
    events += output.finish(is_cut_off=False)
    assert [e["type"].removeprefix("response.") for e in events] == [
        "output_item.added", "content_part.added", "reasoning_text.delta", "reasoning_text.delta",
        "reasoning_text.done", "content_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta",
        "output_text.done", "content_part.done", "output_item.done",
        "output_item.added", "function_call_arguments.delta", "function_call_arguments.delta",
        "function_call_arguments.done", "output_item.done",
        "output_item.added", "function_call_arguments.delta", "function_call_arguments.done", "output_item.done",
    ]
    thought, message, first, second = output.items
    assert thought["type"] == "reasoning" and thought["content"] == [{"type": "reasoning_text", "text": "let me see"}]
    assert thought["summary"] == [] and thought["id"].startswith("rs_")
    assert message["content"][0] == {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}
    assert message["role"] == "assistant" and message["id"].startswith("msg_")
    assert first | {"id": None} == {"id": None, "type": "function_call", "status": "completed", "call_id": "call_0",
                                    "name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert second["name"] == "now" and second["arguments"] == "{}" and second["id"].startswith("fc_")
    assert all(item["status"] == "completed" for item in output.items)
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]


def test_the_stream_adds_up_to_the_items() -> None:
    output = OutputItems()
    events = output.add([reasoning("a"), content("b")]) + output.add([content("c"), call(0, "f", "{")])
    events += output.add([call(0, arguments="}")]) + output.finish(is_cut_off=False)
    rebuilt = replay(events)
    assert [r["text"] for r in rebuilt[:2]] == ["a", "bc"] and rebuilt[2]["arguments"] == "{}"
    assert [r["id"] for r in rebuilt] == [item["id"] for item in output.items]
    done = {e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.done"}
    assert [done[i] for i in sorted(done)] == output.items


def test_a_cut_off_answer_leaves_its_last_item_incomplete() -> None:
    output = OutputItems()
    output.add([content("done"), call(0, "f", '{"x": ')])
    output.finish(is_cut_off=True)
    assert [item["status"] for item in output.items] == ["completed", "incomplete"]
    assert output.items[1]["arguments"] == '{"x": '


def test_an_empty_answer_is_an_empty_message() -> None:
    output = OutputItems()
    events = output.finish(is_cut_off=False)
    assert [e["type"] for e in events][0] == "response.output_item.added"
    assert output.items[0]["content"][0]["text"] == "" and output.items[0]["status"] == "completed"


def test_logprobs_go_with_the_text_and_add_up() -> None:
    output = OutputItems()
    first, second = [{"token": "a", "logprob": -0.5}], [{"token": "b", "logprob": -1.0}]
    events = output.add([content("a")], first) + output.add([content("b")], second) + output.finish(False)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"] for d in deltas] == [first, second]
    assert output.items[0]["content"][0]["logprobs"] == first + second


def test_a_snapshot_shows_the_open_item_so_far() -> None:
    output = OutputItems()
    output.add([content("so far")])
    assert output.snapshot()[0]["content"][0]["text"] == "so far" and output.items == []
    assert output.has_answer
    assert not OutputItems().has_answer
