"""POST /v1/chat/completions: the request body, parsed and validated.

Messages are made ready for the chat template in messages.py; tools, tool_choice and
parallel_tool_calls in tools.py. `reasoning_effort` (and `verbosity`) reach the chat template as
variables of those names, for templates that use them; `chat_template_kwargs` set any other.
"""

from dataclasses import dataclass, field, replace
from typing import ClassVar

from core.sampling_defaults import SERVER_DEFAULTS
from core.sampling_params import LOGPROBS, MAX_TOKENS, SamplingParams
from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.common import GenerationRequest, read_common, read_model
from openai_serve.protocol.fields import Fields, UnknownFields
from openai_serve.protocol.messages import parse_messages
from openai_serve.protocol.tools import ToolRequest, read_tools, with_forced_tools

# OpenAI's values (the SDK's ReasoningEffort and verbosity types).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
VERBOSITIES = ("low", "medium", "high")
TEMPLATE_CHOICES = {"reasoning_effort": REASONING_EFFORTS, "verbosity": VERBOSITIES}


@dataclass(frozen=True)
class ChatRequest(GenerationRequest):
    messages: tuple[dict[str, object], ...]
    template_kwargs: dict[str, object] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: ToolRequest = ToolRequest()
    ignored_fields: tuple[str, ...] = ()  # unknown fields the request sent (see fields.py)
    # The client's name for max_tokens (it has two), in errors about it; the prompt is the messages.
    max_tokens_param: str = "max_tokens"
    prompt_param: ClassVar[str] = "messages"


def parse_chat_request(body: object, unknown: UnknownFields | None = None,
                       defaults: SamplingParams = SERVER_DEFAULTS) -> ChatRequest:
    """`unknown`: where fields nobody reads go (None: each is a 400, as `--strict-request-fields`); `defaults`: what
    the sampling fields the request leaves out take."""
    fields = Fields(body, unknown=unknown)
    model = read_model(fields)
    max_tokens, max_tokens_param = _read_max_tokens(fields)
    common = read_common(fields, model, max_tokens, _read_logprobs(fields), defaults)
    _reject_unsupported(fields)
    if fields.has("chat_template"):
        raise unsupported("chat_template", "is not accepted from clients: the server's template is used "
                          "(variables can be passed in chat_template_kwargs)")
    tools = read_tools(fields)
    request = ChatRequest(
        common=replace(common, sampling=with_forced_tools(common.sampling, tools)),
        messages=parse_messages(fields.raw("messages"), fields.unknown),
        max_tokens_param=max_tokens_param,
        template_kwargs=read_template_kwargs(fields),
        add_generation_prompt=fields.get_bool("add_generation_prompt", True),
        continue_final_message=fields.get_bool("continue_final_message", False),
        tools=tools,
    )
    _check_continuation(request)
    return replace(request, ignored_fields=fields.ignored_fields())


def read_template_kwargs(fields: Fields) -> dict[str, object]:
    """chat_template_kwargs, with reasoning_effort and verbosity where the request sets them."""
    return template_kwargs(fields.get_object("chat_template_kwargs"), reasoning_effort=(fields, "reasoning_effort"),
                           verbosity=(fields, "verbosity"))


def template_kwargs(kwargs: Fields | None, **variables: tuple[Fields | None, str]) -> dict[str, object]:
    """`chat_template_kwargs`, with OpenAI's template variables (reasoning_effort, verbosity) where the
    request sets them, each read from (fields, key): where the client's API puts it."""
    result = {} if kwargs is None else kwargs.raw_items()
    for variable, (fields, key) in variables.items():
        value = None if fields is None else fields.get_str(key, None)
        if value is None:
            continue
        allowed = TEMPLATE_CHOICES[variable]
        if value not in allowed:
            name = fields.name(key)  # type: ignore[union-attr]
            raise bad_request(f"'{name}' must be one of {', '.join(allowed)}, got {value!r}", name)
        result.setdefault(variable, value)
    return result


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
    """Known fields whose values this server cannot honour: each would change the answer."""
    legacy = "is not supported: send 'tools' and 'tool_choice' (OpenAI's replacement for it)"
    fields.unsupported_unless("functions", lambda v: v == [], legacy)
    fields.unsupported_unless("function_call", lambda v: v == "none", legacy)
    fields.unsupported_unless("modalities", lambda v: v == ["text"], "only ['text'] is supported")
    for key in ("audio", "web_search_options"):
        fields.unsupported_unless(key, lambda v: False, "is not supported by this server")
