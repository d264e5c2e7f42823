"""The fields /v1/completions and /v1/chat/completions share: model, n, streaming and sampling.

OpenAI parameters this server does not implement (penalties, logit_bias, ...) are accepted only at
their defaults; anything else is a 400 naming the parameter. vLLM's extras (top_k, min_p,
ignore_eos, min_tokens, stop_token_ids, skip_special_tokens, include_stop_str_in_output) work.
"""

from dataclasses import dataclass, field

from core import SamplingParams, SamplingParamsError
from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.fields import Fields

MAX_N = 128  # OpenAI's limit on choices per request
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class StreamOptions:
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True)
class CommonRequest:
    model: str
    n: int = 1
    stream: StreamOptions = StreamOptions()
    user: str | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # SamplingParams fields every choice shares (not max_tokens or logprobs, which differ by endpoint).
    sampling: dict[str, object] = field(default_factory=dict)


def read_common(fields: Fields) -> CommonRequest:
    model = fields.get_str("model", None)
    if model is None:
        raise bad_request("you must provide a model parameter", "model")
    _reject_unsupported_sampling(fields)
    return CommonRequest(
        model=model,
        n=fields.get_int("n", 1, minimum=1, maximum=MAX_N),
        stream=_read_stream(fields),
        user=fields.get_str("user", None),
        skip_special_tokens=fields.get_bool("skip_special_tokens", True),
        include_stop_str_in_output=fields.get_bool("include_stop_str_in_output", False),
        sampling=_read_sampling(fields),
    )


def _read_sampling(fields: Fields) -> dict[str, object]:
    top_k = fields.get_int("top_k", None, minimum=-1)
    return {
        "temperature": fields.get_float("temperature", 1.0),
        "top_p": fields.get_float("top_p", 1.0),
        # vLLM spells "no top-k" as -1 (or 0); SamplingParams spells it None.
        "top_k": None if top_k is None or top_k <= 0 else top_k,
        "min_p": fields.get_float("min_p", 0.0),
        "seed": fields.get_int("seed", None),
        "stop": fields.str_list("stop"),
        "stop_token_ids": fields.int_list("stop_token_ids"),
        "ignore_eos": fields.get_bool("ignore_eos", False),
        "min_tokens": fields.get_int("min_tokens", 0),
    }


def _read_stream(fields: Fields) -> StreamOptions:
    stream = fields.get_bool("stream", False)
    options = fields.get_object("stream_options")
    if options is None:
        return StreamOptions(stream=stream)
    if not stream:
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    include_usage = options.get_bool("include_usage", False)
    options.unsupported_unless("continuous_usage_stats", lambda v: v is False, "is not supported by this server")
    options.reject_unknown()
    return StreamOptions(stream=True, include_usage=include_usage)


def _reject_unsupported_sampling(fields: Fields) -> None:
    not_yet = "is not supported by this server yet (only its default is accepted)"
    fields.unsupported_unless("presence_penalty", lambda v: v == 0, not_yet)
    fields.unsupported_unless("frequency_penalty", lambda v: v == 0, not_yet)
    fields.unsupported_unless("repetition_penalty", lambda v: v == 1, not_yet)
    fields.unsupported_unless("logit_bias", lambda v: v == {}, not_yet)
    fields.unsupported_unless("store", lambda v: v is False, "is not supported: this server stores nothing")
    fields.unsupported_unless("metadata", lambda v: v == {}, "is not supported: this server stores nothing")
    fields.unsupported_unless("service_tier", lambda v: v in ("auto", "default"), "must be 'auto' or 'default'")


def make_sampling_params(
    common: CommonRequest, choice_index: int, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """The SamplingParams of one choice. Seeded choices get seed + index, as in vLLM, so they differ."""
    kwargs = dict(common.sampling)
    if kwargs["seed"] is not None:
        kwargs["seed"] = kwargs["seed"] + choice_index  # type: ignore[operator]
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kwargs)  # type: ignore[arg-type]
    except SamplingParamsError as exc:
        raise bad_request(str(exc), exc.param) from exc


def check_logprobs(value: int | None, param: str) -> int | None:
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise unsupported(param, f"must be between 0 and {MAX_LOGPROBS}")
    return value
