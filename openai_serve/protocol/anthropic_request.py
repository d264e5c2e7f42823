"""POST /v1/messages and /v1/messages/count_tokens: the request body, read into the chat request it runs as.

Anthropic's Messages API is chat by other names: `system` and `messages` become the conversation
(anthropic_input.py), `tools` and `tool_choice` chat's tools (anthropic_tools.py); `max_tokens`
(required), `temperature` (in Anthropic's range, 0 to 1), `top_p`, `top_k` and `stop_sequences` are
read by chat's sampling rules (common.py), so vLLM's sampling extras (seed, min_p, penalties, ...)
and `chat_template_kwargs` work here too, as on the Responses API. `output_config.format` (a JSON
schema) is structured output, `output_config.effort` the template variable `reasoning_effort`, and
`thinking` the template's reasoning switch `enable_thinking`: `enabled` true, `disabled` false,
`adaptive` (and `between_tools`) the template's default, where the model decides. With `display:
omitted` thinking blocks come without their text. A conversation that ends with the assistant's
message is continued (Anthropic's prefill).

Departures, written down: `thinking.budget_tokens` is checked as Anthropic checks it (at least 1024,
below max_tokens) but thinking is not cut at it: `max_tokens` bounds thinking and answer together.
A `max_tokens` beyond what the context leaves is cut to fit (clients such as Claude Code ask for
tens of thousands), and an answer that runs into the end of the context stops with
`model_context_window_exceeded`, as Anthropic's newer models do. Accepted with no effect on one local
server: `metadata.user_id`, `service_tier`, `speed`, `inference_geo`, `cache_control`, `diagnostics`,
`user_profile_id`, `workspace_id`, and `context_management` edits that clear old thinking (the chat
template decides which earlier thinking it renders); other edits, `container` and `mcp_servers` are a 400.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

from core import SamplingParams, SamplingParamsError
from core.sampling_defaults import SERVER_DEFAULTS
from core.sampling_params import MAX_TOKENS, Bounds
from openai_serve.errors import bad_request, refused, unsupported
from openai_serve.protocol.anthropic_input import read_conversation
from openai_serve.protocol.anthropic_tools import read_anthropic_tools
from openai_serve.protocol.chat import ChatRequest, template_kwargs
from openai_serve.protocol.common import CommonRequest, StreamOptions, read_model, read_sampling
from openai_serve.protocol.fields import Fields, UnknownFields
from openai_serve.protocol.structured import read_output_format, with_structured_output
from openai_serve.protocol.tools import ToolRequest, with_forced_tools

TEMPERATURE = Bounds(0.0, 1.0)  # Anthropic's range
THINKING_BUDGET = Bounds(1024)
THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
THINKING_DISPLAYS = ("summarized", "omitted")


@dataclass(frozen=True)
class MessagesRequest(ChatRequest):
    requested_max_tokens: int = 1  # as the client asked; the sampling's is cut to what the context leaves
    shows_thinking: bool = True  # False with `thinking.display: omitted`
    prompt_param: ClassVar[str] = "messages"

    def within_context(self, num_prompt_tokens: int, max_model_len: int) -> "MessagesRequest":
        """This request with max_tokens cut to what the context leaves after its prompt. A prompt that
        leaves nothing is a 400 in Anthropic's words, which Claude Code reads to compact its conversation."""
        room = max_model_len - num_prompt_tokens
        if room <= 0:
            raise bad_request(f"prompt is too long: {num_prompt_tokens} tokens > {max_model_len - 1} maximum (this "
                              f"model's context holds {max_model_len} tokens, the answer included)", "messages")
        if room >= self.requested_max_tokens:
            return self
        try:
            sampling = replace(self.common.sampling, max_tokens=room)
        except SamplingParamsError as exc:  # a min_tokens the context cannot hold
            raise refused(exc) from exc
        return replace(self, common=replace(self.common, sampling=sampling))


def parse_messages_request(body: object, unknown: UnknownFields | None = None,
                           defaults: SamplingParams = SERVER_DEFAULTS) -> MessagesRequest:
    """`unknown`: where fields nobody reads go (None: each is a 400, as `--strict-request-fields`); `defaults`: what
    the sampling fields the request leaves out take."""
    fields = Fields(body, unknown=unknown)
    model = read_model(fields)
    max_tokens = fields.get_int("max_tokens", None, MAX_TOKENS)
    if max_tokens is None:
        raise bad_request("you must provide a max_tokens parameter", "max_tokens")
    fields.get_float("temperature", None, TEMPERATURE)
    output_config = fields.get_object("output_config")
    prompt = _Prompt.read(fields, output_config, max_tokens)
    sampling = _with_output_format(_read_sampling(fields, max_tokens, defaults), output_config)
    stream = StreamOptions(stream=fields.get_bool("stream", False))
    request = MessagesRequest(
        common=CommonRequest(model=model, sampling=with_forced_tools(sampling, prompt.tools), stream=stream),
        requested_max_tokens=max_tokens, shows_thinking=prompt.shows_thinking, **prompt.chat_fields(),
    )
    _accept_anthropic_only(fields)
    if prompt.tools.is_forced and prompt.enable_thinking:
        raise bad_request("'thinking' cannot be enabled while 'tool_choice' forces a tool ('any' or 'tool'), as in "
                          "Anthropic's API", "tool_choice")
    return replace(request, ignored_fields=fields.ignored_fields())


def parse_count_tokens_request(body: object, unknown: UnknownFields | None = None) -> ChatRequest:
    """The conversation that /v1/messages would prompt the model with for the same body."""
    fields = Fields(body, unknown=unknown)
    model = read_model(fields)
    output_config = fields.get_object("output_config")
    prompt = _Prompt.read(fields, output_config, None)
    if output_config is not None:
        output_config.raw("format")  # shapes the answer, not the prompt
        output_config.check_unknown()
    _accept_anthropic_only(fields)
    request = ChatRequest(common=CommonRequest(model=model), **prompt.chat_fields())
    return replace(request, ignored_fields=fields.ignored_fields())


@dataclass(frozen=True)
class _Prompt:
    """What makes the prompt: the conversation, tools and template variables."""

    messages: tuple[dict[str, object], ...]
    tools: ToolRequest
    template_kwargs: dict[str, object]
    enable_thinking: bool | None  # the template's switch; None leaves it to the template
    shows_thinking: bool

    @classmethod
    def read(cls, fields: Fields, output_config: Fields | None, max_tokens: int | None) -> "_Prompt":
        messages = read_conversation(fields.raw("system"), fields.raw("messages"), fields.unknown)
        kwargs = template_kwargs(fields.get_object("chat_template_kwargs"),
                                 reasoning_effort=(output_config, "effort"))
        enable_thinking, shows_thinking = _read_thinking(fields.get_object("thinking"), max_tokens)
        if enable_thinking is not None:
            kwargs.setdefault("enable_thinking", enable_thinking)
        return cls(messages, read_anthropic_tools(fields), kwargs, enable_thinking, shows_thinking)

    def chat_fields(self) -> dict[str, object]:
        """As ChatRequest's fields; a conversation that ends with the assistant is continued."""
        is_prefill = self.messages[-1]["role"] == "assistant"
        return {"messages": self.messages, "tools": self.tools, "template_kwargs": self.template_kwargs,
                "add_generation_prompt": not is_prefill, "continue_final_message": is_prefill}


def _read_thinking(thinking: Fields | None, max_tokens: int | None) -> tuple[bool | None, bool]:
    """The template's `enable_thinking` (None: left to the template), and whether thinking text is shown."""
    if thinking is None:
        return None, True
    kind = thinking.get_str("type", None)
    if kind not in THINKING_TYPES:
        raise bad_request(f"'thinking.type' must be one of {', '.join(THINKING_TYPES)}, got {kind!r}", "thinking.type")
    if kind == "enabled":
        budget = thinking.get_int("budget_tokens", None, THINKING_BUDGET)
        if budget is None:
            raise bad_request("'thinking.budget_tokens' is required when thinking is enabled", "thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            raise bad_request(f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max_tokens})",
                              "thinking.budget_tokens")
    display = thinking.get_str("display", None)
    if display is not None and display not in THINKING_DISPLAYS:
        raise bad_request(f"'thinking.display' must be one of {', '.join(THINKING_DISPLAYS)}, got {display!r}",
                          "thinking.display")
    thinking.check_unknown()
    return {"enabled": True, "disabled": False}.get(kind), display != "omitted"


def _read_sampling(fields: Fields, max_tokens: int, defaults: SamplingParams) -> SamplingParams:
    """Chat's sampling fields, Anthropic's `stop_sequences` among the stop strings."""
    sampling = read_sampling(fields, max_tokens, None, defaults)
    if sampling.prompt_logprobs is not None:
        raise unsupported("prompt_logprobs", "is not supported on /v1/messages: its answer has no place for them")
    value = fields.raw("stop_sequences")
    if value is None:
        return sampling
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise bad_request("'stop_sequences' must be an array of non-empty strings", "stop_sequences")
    return replace(sampling, stop=(*sampling.stop, *value))


def _with_output_format(sampling: SamplingParams, output_config: Fields | None) -> SamplingParams:
    spec = None if output_config is None else output_config.get_object("format")
    structured = None if spec is None else read_output_format(spec, "output_config.format")
    if output_config is not None:
        output_config.check_unknown()
    if structured is None:
        return sampling
    return with_structured_output(sampling, structured)


def _accept_anthropic_only(fields: Fields) -> None:
    """Anthropic's fields that mean nothing to one local server: accepted when well typed, and unused."""
    metadata = fields.get_object("metadata")
    if metadata is not None:
        metadata.get_str("user_id", None)
        metadata.check_unknown()
    for key in ("service_tier", "speed", "inference_geo", "user_profile_id", "workspace_id"):
        fields.get_str(key, None)
    for key in ("cache_control", "diagnostics"):
        fields.typed(key, lambda v: isinstance(v, dict), "an object", None)
    fields.unsupported_unless("container", lambda v: False, "is not supported: it runs Anthropic's hosted tools")
    fields.unsupported_unless("mcp_servers", lambda v: v == [], "is not supported: MCP servers are the client's to run")
    _check_context_management(fields.get_object("context_management"))


def _check_context_management(value: Fields | None) -> None:
    """Edits that clear old thinking are what the chat template does anyway; others would change the prompt."""
    edits = [] if value is None else value.raw("edits") or []
    if not isinstance(edits, list):
        raise bad_request("'context_management.edits' must be an array", "context_management.edits")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not (isinstance(kind, str) and kind.startswith("clear_thinking")):
            name = f"context_management.edits[{i}].type"
            raise unsupported(name, f"must clear thinking (got {kind!r}): other context edits are not supported")
    if value is not None:
        value.check_unknown()
