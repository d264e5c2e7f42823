"""Anthropic's `system` and `messages` made into chat messages for the chat template.

`system` (a string, or text blocks joined with newlines) is the first message; a `system` message
inside `messages` (Anthropic's mid-conversation system prompt) stays where it is. A user's `text`
blocks are joined with newlines, as chat's text parts are (messages.py); each `tool_result` becomes
a `tool` message with its `tool_call_id` (its content a string or text blocks), in the order the
blocks come, and one with `is_error` reads `Error: <its content>`, since no chat template has a field
for it. An assistant's `text` blocks are its content, its `thinking` its `reasoning_content`, each
`tool_use` a tool call whose arguments are its `input` object (templates write them with `tojson`).
Consecutive messages of one role are one turn, as Anthropic combines them. Messages come out in the
shape chat's do, so both APIs reach the template alike.

Accepted and dropped, as meaning nothing to a template: `cache_control` and `citations` on a block,
a thinking block's `signature`, `redacted_thinking` blocks (opaque by design), and the billing block
Claude Code puts in `system` (`x-anthropic-billing-header: ...`), which is for Anthropic's API, not
its model, and changes per request: kept, it would defeat the prefix cache. Images, documents and
other kinds of block are a 400: without them the model would answer a different question.
"""

import json

from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.fields import Fields, UnknownFields
from openai_serve.protocol.messages import content_text, template_tool_call

ROLES = ("user", "assistant", "system")
BILLING_HEADER = "x-anthropic-billing-header:"
_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "thinking", "redacted_thinking", "tool_use"),
           "system": ("text",)}
_TEXT_PARTS = {"text": "text"}
_MEDIA = ("image", "document")

Message = dict[str, object]


def read_conversation(system: object, messages: object, unknown: UnknownFields) -> tuple[Message, ...]:
    """The chat messages of a request's `system` and `messages`."""
    if messages is None:
        raise bad_request("you must provide a messages parameter", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    conversation = _system(system, unknown)
    for i, message in enumerate(messages):
        conversation += _message(Fields(message, f"messages[{i}].", unknown))
    return tuple(_merge_turns(conversation))


def _system(value: object, unknown: UnknownFields) -> list[Message]:
    if value is None:
        return []
    texts = [value] if isinstance(value, str) else _texts(value, "system", unknown)
    text = "\n".join(t for t in texts if not t.startswith(BILLING_HEADER))
    return [{"role": "system", "content": text}] if text else []


def _message(fields: Fields) -> list[Message]:
    role = fields.get_str("role", None)
    if role not in ROLES:
        name = fields.name("role")
        raise bad_request(f"'{name}' must be one of {', '.join(ROLES)}, got {role!r}", name)
    content = fields.raw("content")
    fields.check_unknown()
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    name = fields.name("content")
    if not isinstance(content, list):
        raise bad_request(f"'{name}' must be a string or an array of content blocks", name)
    turn = _Turn(role)
    for j, block in enumerate(content):
        turn.add(Fields(block, f"{name}[{j}].", fields.unknown))
    return turn.messages()


class _Turn:
    """One message's blocks as chat messages: a user's text and tool results in their order, an
    assistant's text, reasoning and calls as one message."""

    def __init__(self, role: str) -> None:
        self._role = role
        self._messages: list[Message] = []
        self._texts: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[dict[str, object]] = []

    def add(self, block: Fields) -> None:
        kind = block.get_str("type", None)
        allowed = _BLOCKS[self._role]
        if kind not in allowed:
            why = ": images and documents are not supported (the model reads text)" if kind in _MEDIA else ""
            raise unsupported(block.name("type"), f"must be one of {', '.join(allowed)} in a {self._role} message, "
                              f"got {kind!r}{why}")
        if kind == "text":
            self._texts.append(_text(block))
        elif kind == "tool_result":
            self._flush_texts()
            self._messages.append(_tool_result(block))
        elif kind == "thinking":
            self._reasoning.append(_required_str(block, "thinking"))
            block.accept("signature")
        elif kind == "tool_use":
            self._calls.append(_tool_use(block))
        else:  # redacted_thinking: encrypted by Anthropic, nothing a template could render
            block.accept("data")
        block.check_unknown()

    def messages(self) -> list[Message]:
        if self._role != "assistant":
            self._flush_texts(always=not self._messages)
            return self._messages
        message: Message = {"role": "assistant", "content": "\n".join(self._texts)}
        if self._reasoning:
            message["reasoning_content"] = "\n".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = self._calls
        return [message]

    def _flush_texts(self, always: bool = False) -> None:
        if self._texts or always:
            self._messages.append({"role": self._role, "content": "\n".join(self._texts)})
        self._texts = []


def _text(block: Fields) -> str:
    block.accept("cache_control", "citations")
    return _required_str(block, "text")


def _texts(value: object, name: str, unknown: UnknownFields) -> list[str]:
    """A list of text blocks, each block's text."""
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be a string or an array of text blocks", name)
    texts = []
    for j, block in enumerate(value):
        fields = Fields(block, f"{name}[{j}].", unknown)
        kind = fields.get_str("type", None)
        if kind != "text":
            raise unsupported(fields.name("type"), f"must be 'text' (got {kind!r}): only text is supported")
        texts.append(_text(fields))
        fields.check_unknown()
    return texts


def _tool_result(block: Fields) -> Message:
    content = block.raw("content")
    text = "" if content is None else content_text(content, block.name("content"), block.unknown, _TEXT_PARTS)
    if block.get_bool("is_error", False):
        text = f"Error: {text}"
    block.accept("cache_control")
    return {"role": "tool", "tool_call_id": _required_str(block, "tool_use_id"), "content": text}


def _tool_use(block: Fields) -> dict[str, object]:
    arguments = block.raw("input")
    if not isinstance(arguments, dict):
        raise bad_request(f"'{block.name('input')}' must be an object", block.name("input"))
    block.accept("cache_control", "caller")
    return template_tool_call(_required_str(block, "name"), json.dumps(arguments), _required_str(block, "id"))


def _required_str(block: Fields, key: str) -> str:
    value = block.get_str(key, None)
    if value is None:
        raise bad_request(f"'{block.name(key)}' must be a string", block.name(key))
    return value


def _merge_turns(messages: list[Message]) -> list[Message]:
    """Consecutive user messages, or assistant ones, as one (tool results and system messages stay apart)."""
    merged: list[Message] = []
    for message in messages:
        last = merged[-1] if merged else None
        if last is None or last["role"] != message["role"] or message["role"] not in ("user", "assistant"):
            merged.append(message)
            continue
        merged[-1] = _joined(last, message)
    return merged


def _joined(first: Message, second: Message) -> Message:
    joined = {**first, "content": "\n".join(str(m["content"]) for m in (first, second) if m["content"])}
    reasoning = [str(m["reasoning_content"]) for m in (first, second) if m.get("reasoning_content")]
    if reasoning:
        joined["reasoning_content"] = "\n".join(reasoning)
    calls = [call for m in (first, second) for call in m.get("tool_calls", ())]  # type: ignore[attr-defined]
    if calls:
        joined["tool_calls"] = calls
    return joined
