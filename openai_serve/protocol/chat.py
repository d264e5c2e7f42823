"""POST /v1/chat/completions: the request body, parsed and validated.

Messages are normalized for the model's chat template: content that is a list of text parts is
joined with newlines into one string (as vLLM does, since many templates only render strings), and
the `developer` role is rendered as `system` (departure: OpenAI treats them alike, templates rarely
know `developer`). Tools, images and audio are not supported: a 400 names the field.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from core.sampling_params import LOGPROBS, MAX_TOKENS
from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.common import CommonRequest, read_common, read_model
from openai_serve.protocol.fields import Fields

ROLES = ("system", "developer", "user", "assistant", "tool")
NO_TOOLS = "is not supported by this server (no tool calling)"


@dataclass(frozen=True)
class ChatRequest:
    common: CommonRequest
    messages: tuple[dict[str, object], ...]
    template_kwargs: dict[str, object] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # The client's name for max_tokens (it has two), in errors about it; the prompt is the messages.
    max_tokens_param: str = "max_tokens"
    prompt_param: ClassVar[str] = "messages"

    @property
    def max_tokens(self) -> int | None:
        """None: the rest of the context."""
        return self.common.sampling.max_tokens

    @property
    def logprobs(self) -> int | None:
        """Top alternatives per token; None: no logprobs."""
        return self.common.sampling.logprobs


def parse_chat_request(body: object) -> ChatRequest:
    fields = Fields(body)
    model = read_model(fields)
    max_tokens, max_tokens_param = _read_max_tokens(fields)
    common = read_common(fields, model, max_tokens, _read_logprobs(fields))
    _reject_unsupported(fields)
    if fields.has("chat_template"):
        raise unsupported("chat_template", "is not accepted from clients: the server's template is used "
                          "(variables can be passed in chat_template_kwargs)")
    kwargs = fields.get_object("chat_template_kwargs")
    request = ChatRequest(
        common=common,
        messages=parse_messages(fields.raw("messages")),
        max_tokens_param=max_tokens_param,
        template_kwargs={} if kwargs is None else kwargs.raw_items(),
        add_generation_prompt=fields.get_bool("add_generation_prompt", True),
        continue_final_message=fields.get_bool("continue_final_message", False),
    )
    _check_continuation(request)
    fields.reject_unknown()
    return request


def parse_messages(messages: object) -> tuple[dict[str, object], ...]:
    if messages is None:
        raise bad_request("you must provide a messages parameter", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    return tuple(_parse_message(message, f"messages[{i}]") for i, message in enumerate(messages))


def _parse_message(message: object, name: str) -> dict[str, object]:
    fields = Fields(message, name + ".")
    role = fields.get_str("role", None)
    if role not in ROLES:
        raise bad_request(f"'{name}.role' must be one of {', '.join(ROLES)}, got {role!r}", f"{name}.role")
    fields.unsupported_unless("tool_calls", lambda v: v == [], NO_TOOLS)
    fields.unsupported_unless("function_call", lambda v: False, NO_TOOLS)
    parsed: dict[str, object] = {"role": "system" if role == "developer" else role}
    parsed["content"] = _parse_content(fields, role == "assistant")
    for key in ("name", "tool_call_id"):
        value = fields.get_str(key, None)
        if value is not None:
            parsed[key] = value
    fields.unsupported_unless("refusal", lambda v: False, "is not supported in messages")
    fields.reject_unknown()
    return parsed


def _parse_content(fields: Fields, may_be_null: bool) -> str:
    content = fields.raw("content")
    name = fields.name("content")
    if content is None and may_be_null:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{name}' must be a string or an array of content parts", name)
    return "\n".join(_text_part(part, f"{name}[{j}]") for j, part in enumerate(content))


def _text_part(part: object, name: str) -> str:
    fields = Fields(part, name + ".")
    kind = fields.get_str("type", None)
    if kind != "text":
        raise unsupported(f"{name}.type", f"must be 'text' (got {kind!r}): only text content is supported")
    text = fields.get_str("text", None)
    if text is None:
        raise bad_request(f"'{name}.text' must be a string", f"{name}.text")
    fields.reject_unknown()
    return text


def _read_max_tokens(fields: Fields) -> tuple[int | None, str]:
    """The value and the name the client sent it under (OpenAI's newer name first)."""
    max_tokens = fields.get_int("max_tokens", None, MAX_TOKENS)
    max_completion_tokens = fields.get_int("max_completion_tokens", None, MAX_TOKENS)
    if None not in (max_tokens, max_completion_tokens) and max_tokens != max_completion_tokens:
        raise bad_request("'max_tokens' and 'max_completion_tokens' disagree; send one of them", "max_tokens")
    if max_completion_tokens is not None:
        return max_completion_tokens, "max_completion_tokens"
    return max_tokens, "max_tokens"


def _read_logprobs(fields: Fields) -> int | None:
    wants_logprobs = fields.get_bool("logprobs", False)
    top_logprobs = fields.get_int("top_logprobs", None, LOGPROBS)
    if top_logprobs is not None and not wants_logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    return (top_logprobs or 0) if wants_logprobs else None


def _check_continuation(request: ChatRequest) -> None:
    if not request.continue_final_message:
        return
    if request.add_generation_prompt:
        raise bad_request("'continue_final_message' needs 'add_generation_prompt' set to false",
                          "continue_final_message")
    if request.messages[-1]["role"] != "assistant":
        raise bad_request("'continue_final_message' needs the last message to be from the assistant",
                          "continue_final_message")


def _reject_unsupported(fields: Fields) -> None:
    fields.unsupported_unless("tools", lambda v: v == [], NO_TOOLS)
    fields.unsupported_unless("tool_choice", lambda v: v == "none", NO_TOOLS)
    fields.unsupported_unless("functions", lambda v: v == [], NO_TOOLS)
    fields.unsupported_unless("function_call", lambda v: v == "none", NO_TOOLS)
    fields.unsupported_unless("parallel_tool_calls", lambda v: False, NO_TOOLS)
    fields.unsupported_unless("response_format", lambda v: v == {"type": "text"},
                              "only {'type': 'text'} is supported")
    fields.unsupported_unless("modalities", lambda v: v == ["text"], "only ['text'] is supported")
    for key in ("audio", "prediction", "reasoning_effort", "web_search_options"):
        fields.unsupported_unless(key, lambda v: False, "is not supported by this server")
