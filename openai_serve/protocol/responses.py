"""POST /v1/responses: the request body, parsed and validated into the chat request it runs as.

The Responses API is chat by other names: `instructions` and `input` become the conversation
(response_input.py), `max_output_tokens` is max_tokens, function tools and a named `tool_choice`
are flat, `text.format` is response_format (structured output, read by the same rules),
`reasoning.effort` and `text.verbosity` are template variables. Each is read by chat's own rules
(sampling, tools, template variables) into a `ChatRequest`, so both APIs prompt, sample and parse
alike; vLLM's sampling extras (top_k, seed, stop, ...) and `chat_template_kwargs` work here too.
What is the Responses API's own (store, previous_response_id, background, metadata, include) is
kept beside it.

`store` defaults to true, as in OpenAI (the server keeps a bounded number of responses, for a
bounded time: response_store.py). OpenAI's fields that mean nothing to one local server (service
tier, caching hints, abuse ids, `truncation`, `max_tool_calls`, which counts hosted tools' calls)
are accepted when well typed; reusable `prompt`s and `conversation`s, which live in OpenAI's
storage, are a 400.
"""

from dataclasses import dataclass, field, replace
from typing import ClassVar

from core import SamplingParams
from core.sampling_defaults import SERVER_DEFAULTS
from core.sampling_params import LOGPROBS, MAX_TOKENS
from openai_serve.errors import bad_request
from openai_serve.protocol.chat import ChatRequest, template_kwargs
from openai_serve.protocol.common import CommonRequest, StreamOptions, read_model, read_sampling
from openai_serve.protocol.fields import Fields, UnknownFields
from openai_serve.protocol.input_items import stored_input_items
from openai_serve.protocol.response_input import parse_input
from openai_serve.protocol.structured import read_output_format, with_structured_output
from openai_serve.protocol.tools import read_response_tools, with_forced_tools

OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for the answer's logprobs
# Every value OpenAI's `include` takes (the SDK's ResponseIncludable); any other is a 400.
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs", "reasoning.encrypted_content", OUTPUT_LOGPROBS)
SUMMARIES = ("auto", "concise", "detailed")
TRUNCATIONS = ("auto", "disabled")
# OpenAI's limits on metadata: they bound what a stored response keeps of it.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


@dataclass(frozen=True)
class ResponsesRequest(ChatRequest):
    """A chat request whose `messages` are the instructions and the input (`with_history` puts the
    conversation it continues between them), with the Responses API's own fields."""

    input_messages: tuple[dict[str, object], ...] = ()
    input_items: tuple[dict[str, object], ...] = ()  # `input` as GET .../input_items lists it
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    # The request's settings as the response object repeats them (tools, text, reasoning, ...).
    settings: dict[str, object] = field(default_factory=dict)
    max_tokens_param: str = "max_output_tokens"
    prompt_param: ClassVar[str] = "input"

    @property
    def conversation(self) -> tuple[dict[str, object], ...]:
        """The messages without the instructions: the conversation continued, then the input."""
        return self.messages[len(_instructions(self.instructions)):]

    def with_history(self, history: tuple[dict[str, object], ...]) -> "ResponsesRequest":
        """This request continuing a conversation: instructions (never carried over, as in OpenAI),
        the conversation so far, then the input."""
        return replace(self, messages=(*_instructions(self.instructions), *history, *self.input_messages))


def parse_responses_request(body: object, unknown: UnknownFields | None = None,
                            defaults: SamplingParams = SERVER_DEFAULTS) -> ResponsesRequest:
    """`unknown`: where fields nobody reads go (None: each is a 400, as `--strict-request-fields`); `defaults`: what
    the sampling fields the request leaves out take."""
    fields = Fields(body, unknown=unknown)
    model = read_model(fields)
    max_tokens = fields.get_int("max_output_tokens", None, MAX_TOKENS)
    top_logprobs = fields.get_int("top_logprobs", None, LOGPROBS)
    logprobs = (top_logprobs or 0) if OUTPUT_LOGPROBS in read_include(fields.raw("include")) else None
    text, reasoning = fields.get_object("text"), fields.get_object("reasoning")
    sampling, text_format = _with_text_format(read_sampling(fields, max_tokens, logprobs, defaults), text)
    tools = read_response_tools(fields)
    sampling = with_forced_tools(sampling, tools)
    instructions = fields.get_str("instructions", None)
    input_messages = parse_input(fields.raw("input"), fields.unknown)
    request = ResponsesRequest(
        common=CommonRequest(model=model, sampling=sampling, stream=_read_stream(fields),
                             user=fields.get_str("user", None)),
        messages=(*_instructions(instructions), *input_messages),
        input_messages=input_messages,
        input_items=stored_input_items(fields.raw("input")),
        instructions=instructions,
        template_kwargs=template_kwargs(fields.get_object("chat_template_kwargs"),
                                        reasoning_effort=(reasoning, "effort"), verbosity=(text, "verbosity")),
        tools=tools,
        previous_response_id=fields.get_str("previous_response_id", None),
        store=fields.get_bool("store", True),
        background=fields.get_bool("background", False),
        metadata=_read_metadata(fields),
    )
    if request.background and not request.store:
        raise bad_request("'background' responses must be stored: 'store' cannot be false", "background")
    settings = _settings(fields, request, text_format, _read_summary(reasoning), top_logprobs)
    _accept_openai_only(fields)
    for part in (text, reasoning):
        if part is not None:
            part.check_unknown()
    return replace(request, settings=settings, ignored_fields=fields.ignored_fields())


def _instructions(instructions: str | None) -> tuple[dict[str, object], ...]:
    return ({"role": "system", "content": instructions},) if instructions else ()


def _read_stream(fields: Fields) -> StreamOptions:
    stream = fields.get_bool("stream", False)
    options = fields.get_object("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        options.get_bool("include_obfuscation", None)  # padding against length side channels: nothing to pad here
        options.check_unknown()
    return StreamOptions(stream=stream)


def read_include(value: object) -> tuple[str, ...]:
    """What a response (or its input items) should also carry. Only the answer's logprobs are
    something this server makes; the others name outputs of hosted tools (never run here), input
    images (a 400 here) or OpenAI's encrypted reasoning (reasoning items here carry their text, and
    input items are listed as sent), so they add nothing."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("'include' must be an array of strings", "include")
    for item in value:
        if item not in INCLUDABLE:
            raise bad_request(f"'include' values must be among {', '.join(INCLUDABLE)}, got {item!r}", "include")
    return tuple(value)


def _with_text_format(sampling: SamplingParams, text: Fields | None) -> tuple[SamplingParams, dict[str, object]]:
    """`text.format` as structured output (read as chat's response_format is), and as the response
    repeats it."""
    spec = None if text is None else text.get_object("format")
    if spec is None:
        return sampling, {"type": "text"}
    structured = read_output_format(spec, "text.format")
    echo = text.raw("format")  # type: ignore[union-attr]
    if structured is None:
        return sampling, echo  # type: ignore[return-value]
    return with_structured_output(sampling, structured), echo  # type: ignore[return-value]


def _read_summary(reasoning: Fields | None) -> str | None:
    """A reasoning summary: accepted, but there is no summarizer here: reasoning items carry the
    reasoning text itself (`content`) and an empty `summary`."""
    if reasoning is None:
        return None
    summary = reasoning.get_str("summary", None) or reasoning.get_str("generate_summary", None)
    if summary is not None and summary not in SUMMARIES:
        name = reasoning.name("summary")
        raise bad_request(f"'{name}' must be one of {', '.join(SUMMARIES)}, got {summary!r}", name)
    return summary


def _read_metadata(fields: Fields) -> dict[str, str]:
    value = fields.raw("metadata")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise bad_request("'metadata' must be an object of strings", "metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise bad_request(f"'metadata' may hold at most {MAX_METADATA_PAIRS} pairs, got {len(value)}", "metadata")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY or len(item) > MAX_METADATA_VALUE:
            raise bad_request(f"'metadata' keys may be at most {MAX_METADATA_KEY} characters and values at most "
                              f"{MAX_METADATA_VALUE} (key {key[:MAX_METADATA_KEY]!r})", "metadata")
    return value


def _settings(
    fields: Fields, request: ResponsesRequest, text_format: dict[str, object], summary: str | None,
    top_logprobs: int | None,
) -> dict[str, object]:
    sampling = request.common.sampling
    truncation = fields.get_str("truncation", "disabled")
    if truncation not in TRUNCATIONS:
        raise bad_request(f"'truncation' must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}", "truncation")
    return {
        "instructions": request.instructions, "max_output_tokens": sampling.max_tokens,
        "max_tool_calls": fields.get_int("max_tool_calls", None), "metadata": request.metadata,
        "parallel_tool_calls": request.tools.parallel_tool_calls, "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": request.template_kwargs.get("reasoning_effort"), "summary": summary},
        "store": request.store, "background": request.background, "temperature": sampling.temperature,
        "text": {"format": text_format, "verbosity": request.template_kwargs.get("verbosity", "medium")},
        "tool_choice": fields.raw("tool_choice") or "auto", "tools": fields.raw("tools") or [],
        "top_logprobs": top_logprobs or 0, "top_p": sampling.top_p, "truncation": truncation,
        "user": request.common.user, "service_tier": fields.get_str("service_tier", None) or "default",
    }


def _accept_openai_only(fields: Fields) -> None:
    for key in ("safety_identifier", "prompt_cache_key", "prompt_cache_retention"):
        fields.get_str(key, None)
    for key in ("prompt_cache_options", "moderation"):
        fields.typed(key, lambda v: isinstance(v, dict), "an object", None)
    for key in ("prompt", "conversation"):
        fields.unsupported_unless(key, lambda v: False, "is not supported: it lives in OpenAI's storage; send "
                                  "'input' (and 'previous_response_id')")
    fields.unsupported_unless("context_management", lambda v: v == [], "is not supported by this server")
