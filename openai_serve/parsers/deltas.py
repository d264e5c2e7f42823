"""What output parsers hand on: pieces of one assistant message, in the order the model wrote them.

A message is content, reasoning (with `--reasoning-parser`) and tool calls. A tool call's first
delta has its `id` and `name`; later ones add to its `arguments`, which are the model's raw JSON text
in pieces. Streaming sends the pieces as they come; a response in full is their `fold`, so the two
always agree.
"""

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCallDelta:
    index: int  # the call's place in the message
    id: str | None = None  # with `name`, on the call's first delta only
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class MessageDelta:
    content: str = ""
    reasoning: str = ""
    tool_call: ToolCallDelta | None = None


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class AssistantMessage:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def new_tool_call_id() -> str:
    """OpenAI's shape of an id (`call_` and 24 characters); unique per call, never reused."""
    return f"call_{uuid.uuid4().hex[:24]}"


def fold(deltas: list[MessageDelta]) -> AssistantMessage:
    message = AssistantMessage()
    content, reasoning = [], []
    calls: dict[int, ToolCall] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
        call = delta.tool_call
        if call is not None:
            if call.name is not None:
                calls[call.index] = ToolCall(call.id or new_tool_call_id(), call.name)
            arguments.setdefault(call.index, []).append(call.arguments)
    message.content, message.reasoning = "".join(content), "".join(reasoning)
    for index, call in sorted(calls.items()):
        call.arguments = "".join(arguments[index])
        message.tool_calls.append(call)
    return message
