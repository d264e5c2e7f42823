"""Chat messages as clients send them, made ready for the chat template.

Content that is a list of text parts is joined with newlines into one string (as vLLM does: many
templates only render strings); `developer` is rendered as `system` (departure: OpenAI treats them
alike, templates rarely know `developer`). An assistant's `tool_calls` reach the template with their
arguments as objects when they are JSON objects (templates write them with `tojson`; vLLM does the
same), a tool's reply with its `tool_call_id`, an assistant's `reasoning_content` (or `reasoning`)
as `reasoning_content`, which thinking models' templates read.

What SDKs and chat UIs send back that means nothing to a template is accepted and dropped: a reply's
`annotations`, `audio` and `function_call: null`, `cache_control` on a part; a `refusal` becomes the
content of an assistant message that has none. Images, audio and files are a 400: without them the
model would answer a different question.
"""

import json

from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.fields import Fields, UnknownFields

ROLES = ("system", "developer", "user", "assistant", "tool")
CHAT_PARTS = {"text": "text", "refusal": "refusal"}  # an assistant's content may hold its refusal as a part


def parse_messages(messages: object, unknown: UnknownFields) -> tuple[dict[str, object], ...]:
    if messages is None:
        raise bad_request("you must provide a messages parameter", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    return tuple(_parse_message(Fields(m, f"messages[{i}].", unknown)) for i, m in enumerate(messages))


def _parse_message(fields: Fields) -> dict[str, object]:
    role = fields.get_str("role", None)
    if role not in ROLES:
        name = fields.name("role")
        raise bad_request(f"'{name}' must be one of {', '.join(ROLES)}, got {role!r}", name)
    parsed: dict[str, object] = {"role": "system" if role == "developer" else role}
    parsed["content"] = _parse_content(fields, may_be_null=role == "assistant")
    for key in ("name", "tool_call_id"):
        value = fields.get_str(key, None)
        if value is not None:
            parsed[key] = value
    if role == "assistant":
        parsed.update(_assistant_parts(fields, has_content=bool(parsed["content"])))
    fields.accept("annotations", "audio")
    fields.check_unknown()
    return parsed


def _assistant_parts(fields: Fields, has_content: bool) -> dict[str, object]:
    parts: dict[str, object] = {}
    refusal = fields.get_str("refusal", None)
    if refusal and not has_content:
        parts["content"] = refusal
    reasoning = fields.get_str("reasoning_content", None) or fields.get_str("reasoning", None)
    if reasoning:
        parts["reasoning_content"] = reasoning
    tool_calls = _parse_tool_calls(fields.raw("tool_calls"), fields.name("tool_calls"), fields.unknown)
    if tool_calls:
        parts["tool_calls"] = tool_calls
    fields.unsupported_unless("function_call", lambda v: False, "is not supported: send 'tool_calls'")
    return parts


def _parse_content(fields: Fields, may_be_null: bool) -> str:
    content = fields.raw("content")
    if content is None and may_be_null:
        return ""
    return content_text(content, fields.name("content"), fields.unknown)


def content_text(content: object, name: str, unknown: UnknownFields, parts: dict[str, str] = CHAT_PARTS) -> str:
    """A string, or text parts joined with newlines; `parts`: each part type and the key of its text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{name}' must be a string or an array of content parts", name)
    return "\n".join(_text_part(Fields(part, f"{name}[{j}].", unknown), parts) for j, part in enumerate(content))


def _text_part(fields: Fields, parts: dict[str, str]) -> str:
    kind = fields.get_str("type", None)
    if kind not in parts:
        name = fields.name("type")
        raise unsupported(name, f"must be '{next(iter(parts))}' (got {kind!r}): only text content is supported")
    key = parts[kind]
    text = fields.get_str(key, None)
    if text is None:
        raise bad_request(f"'{fields.name(key)}' must be a string", fields.name(key))
    # Anthropic's prompt-caching hint (LibreChat and OpenRouter users send it); what the Responses API
    # returns with a text and takes back (annotations, logprobs) and its own caching hint.
    fields.accept("cache_control", "annotations", "logprobs", "prompt_cache_breakpoint")
    fields.check_unknown()
    return text


def _parse_tool_calls(value: object, name: str, unknown: UnknownFields) -> list[dict[str, object]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be an array of tool calls", name)
    return [_parse_tool_call(Fields(call, f"{name}[{i}].", unknown)) for i, call in enumerate(value)]


def _parse_tool_call(fields: Fields) -> dict[str, object]:
    kind = fields.get_str("type", "function")
    if kind != "function":
        raise unsupported(fields.name("type"), f"must be 'function' (got {kind!r})")
    function = fields.get_object("function")
    if function is None:
        raise bad_request(f"'{fields.name('function')}' is required", fields.name("function"))
    function_name = function.get_str("name", None)
    arguments = function.get_str("arguments", None)
    if function_name is None or arguments is None:
        missing = function.name("name" if function_name is None else "arguments")
        raise bad_request(f"'{missing}' must be a string", missing)
    call = template_tool_call(function_name, arguments, fields.get_str("id", None))
    fields.accept("index")  # streamed calls carry one; clients that merge deltas send it back
    fields.check_unknown()
    return call


def template_tool_call(name: str, arguments: str, call_id: str | None) -> dict[str, object]:
    """An assistant's tool call as the chat template gets it."""
    call: dict[str, object] = {"type": "function", "function": {"name": name, "arguments": _as_object(arguments)}}
    if call_id is not None:
        call["id"] = call_id
    return call


def _as_object(arguments: str) -> object:
    """The arguments as a JSON object where they are one (templates `tojson` them); else as sent."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments
