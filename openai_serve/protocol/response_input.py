"""The Responses API's `input` made into chat messages for the chat template.

`input` is a string (one user message) or a list of items: messages (`input_text` parts, or an
assistant's `output_text` and `refusal` parts, or a string), `function_call` items (a call the
model made), `function_call_output` items (its result), and `reasoning` items (a thinking model's
reasoning, as this server returns it). The items of one assistant turn, as a response's `output`
lists them (reasoning, then a message, then calls), become one assistant message with
`reasoning_content`, `content` and `tool_calls`, which is what chat templates render; a result
becomes a `tool` message with its `tool_call_id`. Messages come out in the shape chat's
(messages.py) do, so both APIs reach the template alike.

What SDKs send back with an output item and means nothing to a template is accepted: item `id`s,
`status`, a message's `phase`, a part's `annotations` and `logprobs`, a reasoning item's `summary`
(when it has `content`) and `encrypted_content`. Items of hosted tools, images and files are a 400.
"""

from dataclasses import dataclass, field

from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.fields import Fields, UnknownFields
from openai_serve.protocol.messages import content_text, template_tool_call

ROLES = ("user", "system", "developer", "assistant")
_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_REASONING_PARTS = {"reasoning_text": "text"}
_SUMMARY_PARTS = {"summary_text": "text"}


def parse_input(value: object, unknown: UnknownFields) -> tuple[dict[str, object], ...]:
    if value is None:
        raise bad_request("you must provide an input parameter", "input")
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of input items", "input")
    conversation = _Conversation()
    for i, item in enumerate(value):
        conversation.add(Fields(item, f"input[{i}].", unknown))
    return tuple(turn.message() if isinstance(turn, _AssistantTurn) else turn for turn in conversation.turns)


@dataclass
class _AssistantTurn:
    """One assistant message built from consecutive output items, in the order a response lists them."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, object]] = field(default_factory=list)

    def stage(self) -> int:
        return 2 if self.tool_calls else 1 if self.content else 0

    def message(self) -> dict[str, object]:
        message: dict[str, object] = {"role": "assistant", "content": "\n".join(self.content)}
        if self.reasoning:
            message["reasoning_content"] = "\n".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class _Conversation:
    def __init__(self) -> None:
        self.turns: list[dict[str, object] | _AssistantTurn] = []

    def add(self, item: Fields) -> None:
        kind = item.get_str("type", None)
        item.accept("id", "status")
        if kind == "message" or (kind is None and item.has("role")):
            self._message(item)
        elif kind == "function_call":
            call = template_tool_call(_required_str(item, "name"), _required_str(item, "arguments"),
                                      _required_str(item, "call_id"))
            item.accept("caller", "namespace")
            self._assistant(2).tool_calls.append(call)
        elif kind == "function_call_output":
            output = content_text(item.raw("output"), item.name("output"), item.unknown, _PARTS)
            self.turns.append({"role": "tool", "tool_call_id": _required_str(item, "call_id"), "content": output})
            item.accept("caller", "name", "namespace")
        elif kind == "reasoning":
            self._reasoning(item)
        else:
            raise unsupported(item.name("type"), f"must be one of message, function_call, function_call_output, "
                              f"reasoning (got {kind!r}): other input items are not supported")
        item.check_unknown()

    def _message(self, item: Fields) -> None:
        role = item.get_str("role", None)
        if role not in ROLES:
            name = item.name("role")
            raise bad_request(f"'{name}' must be one of {', '.join(ROLES)}, got {role!r}", name)
        content = content_text(item.raw("content"), item.name("content"), item.unknown, _PARTS)
        item.accept("phase")
        if role == "assistant":
            self._assistant(1).content.append(content)
        else:  # `developer` is rendered as `system`, as in chat (messages.py)
            self.turns.append({"role": "system" if role == "developer" else role, "content": content})

    def _reasoning(self, item: Fields) -> None:
        """Its reasoning text (`content`), or its summary where it has none."""
        name = item.name("content")
        texts = content_text(item.raw("content") or [], name, item.unknown, _REASONING_PARTS)
        if not texts:
            texts = content_text(item.raw("summary") or [], item.name("summary"), item.unknown, _SUMMARY_PARTS)
        item.accept("summary", "encrypted_content")
        if texts:
            self._assistant(0).reasoning.append(texts)

    def _assistant(self, stage: int) -> _AssistantTurn:
        """The assistant turn an item of this stage (0 reasoning, 1 text, 2 a call) belongs to: the
        last one while the item does not go back to an earlier stage, else a new one."""
        last = self.turns[-1] if self.turns else None
        if isinstance(last, _AssistantTurn) and last.stage() <= stage:
            return last
        turn = _AssistantTurn()
        self.turns.append(turn)
        return turn


def _required_str(item: Fields, key: str) -> str:
    value = item.get_str(key, None)
    if value is None:
        raise bad_request(f"'{item.name(key)}' must be a string", item.name(key))
    return value
