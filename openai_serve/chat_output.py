"""An assistant message's parts in OpenAI's JSON: a streamed delta, or the message in full.

A streamed call opens with `{"index", "id", "type": "function", "function": {"name", "arguments"}}`
and goes on with `{"index", "function": {"arguments"}}` pieces, one entry per call per chunk, as
OpenAI streams them. Reasoning goes out as `reasoning_content` and, under vLLM's newer name,
`reasoning`. In full, `content` is null when the message is only tool calls or only reasoning.
"""

from openai_serve.parsers.deltas import AssistantMessage, MessageDelta


def delta_json(parts: list[MessageDelta]) -> dict[str, object]:
    """One chunk's delta from the parts one wake-up produced (empty when they hold nothing)."""
    delta: dict[str, object] = {}
    content = "".join(part.content for part in parts)
    if content:
        delta["content"] = content
    reasoning = "".join(part.reasoning for part in parts)
    if reasoning:
        delta["reasoning_content"] = delta["reasoning"] = reasoning
    calls: dict[int, dict[str, object]] = {}
    for part in parts:
        call = part.tool_call
        if call is None:
            continue
        entry = calls.setdefault(call.index, {"index": call.index, "function": {"arguments": ""}})
        function: dict[str, str] = entry["function"]  # type: ignore[assignment]
        if call.name is not None:
            entry.update(id=call.id, type="function")
            function["name"] = call.name
        function["arguments"] += call.arguments
    if calls:
        delta["tool_calls"] = list(calls.values())
    return delta


def message_json(message: AssistantMessage, has_reasoning: bool) -> dict[str, object]:
    calls = [call.to_dict() for call in message.tool_calls]
    is_answered_elsewhere = bool(calls) or bool(message.reasoning)
    content = message.content if message.content or not is_answered_elsewhere else None
    result: dict[str, object] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        result["tool_calls"] = calls
    if has_reasoning:
        result["reasoning_content"] = result["reasoning"] = message.reasoning or None
    return result


def finish_reason(engine_reason: str | None, has_tool_calls: bool) -> str | None:
    """OpenAI's `tool_calls` for an answer that ended by itself in calls (a cut-off one stays `length`)."""
    return "tool_calls" if has_tool_calls and engine_reason == "stop" else engine_reason
