"""A response's `input` as GET /v1/responses/{id}/input_items lists it: each item as the client sent
it, given an `id` where it had none and a `status`, in the shapes OpenAI returns them.

A string input is one user `message` with one `input_text` part; a message whose `content` is a
string gets one part (`input_text`, or `output_text` for an assistant's). An assistant's
`output_text` part gets its `annotations` (empty), which OpenAI's output messages always carry.
`instructions` are not input items (as in OpenAI), nor is the conversation a `previous_response_id`
continues: only this request's own input is listed. Called once `input` has been read
(response_input.py), so every item here is one that rule accepted.
"""

from openai_serve.response_output import new_item_id

# OpenAI's id prefixes for the kinds of input item this server accepts.
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def stored_input_items(value: object) -> tuple[dict[str, object], ...]:
    """`value`: the request's `input`, already accepted by parse_input."""
    if isinstance(value, str):
        return (_item({"type": "message", "role": "user", "content": value}),)
    assert isinstance(value, list)
    return tuple(_item(dict(raw)) for raw in value)


def _item(item: dict[str, object]) -> dict[str, object]:
    kind = item.setdefault("type", "message")  # an item with a role and no type is a message
    if not isinstance(item.get("id"), str) or not item["id"]:
        item["id"] = new_item_id(_ID_PREFIXES[str(kind)])
    item.setdefault("status", "completed")
    return _message(item) if kind == "message" else item


def _message(item: dict[str, object]) -> dict[str, object]:
    is_assistant = item["role"] == "assistant"
    content = item["content"]
    if isinstance(content, str):
        content = [{"type": "output_text" if is_assistant else "input_text", "text": content}]
    parts = [_part(dict(part)) for part in content]  # type: ignore[union-attr]
    return {**item, "content": parts}


def _part(part: dict[str, object]) -> dict[str, object]:
    if part.get("type") == "output_text":
        part.setdefault("annotations", [])
    return part
