"""The fields /v1/completions and /v1/chat/completions share: model, n, streaming and sampling.

`read_sampling` is the one place where request fields become `SamplingParams` (vLLM's
`to_sampling_params()`); ranges are core's (core/sampling_params.py), checked under the client's
field names. A sampling field the request leaves out takes the served model's default
(core/sampling_defaults.py: its generation_config.json, as vLLM's `--generation-config auto`), and
max_tokens left out (None) gets its default once the prompt's length is known (generation.py).
OpenAI's penalties and logit_bias, structured output (protocol/structured.py) and vLLM's extras
(top_k, min_p, repetition_penalty, ignore_eos, min_tokens, stop_token_ids, skip_special_tokens,
include_stop_str_in_output) all reach the engine.
"""

from dataclasses import dataclass, replace

from core import SamplingParams, SamplingParamsError
from core.sampling_params import (
    FREQUENCY_PENALTY,
    LOGIT_BIAS,
    LOGPROBS,
    MIN_P,
    MIN_TOKENS,
    PRESENCE_PENALTY,
    REPETITION_PENALTY,
    SEED,
    TEMPERATURE,
    TOP_P,
    Bounds,
    offset_seed,
)
from openai_serve.errors import bad_request, refused, unsupported
from openai_serve.protocol.fields import Fields, is_number
from openai_serve.protocol.structured import read_structured_output

N = Bounds(1, 128)  # choices per request, as OpenAI allows
REQUEST_TOP_K = Bounds(-1)  # vLLM spells "no top-k" -1 (or 0)


@dataclass(frozen=True)
class StreamOptions:
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk has the usage so far


@dataclass(frozen=True)
class CommonRequest:
    model: str
    # What every choice asks for; choice i's own is choice_params(sampling, i).
    sampling: SamplingParams = SamplingParams()
    n: int = 1
    stream: StreamOptions = StreamOptions()
    user: str | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """What a request to either generation endpoint holds besides its prompt."""

    common: CommonRequest

    @property
    def max_tokens(self) -> int | None:
        """None: the rest of the context."""
        return self.common.sampling.max_tokens

    @property
    def logprobs(self) -> int | None:
        """Top alternatives per token; None: no logprobs."""
        return self.common.sampling.logprobs


def read_model(fields: Fields) -> str:
    model = fields.get_str("model", None)
    if model is None:
        raise bad_request("you must provide a model parameter", "model")
    return model


def read_common(fields: Fields, model: str, max_tokens: int | None, logprobs: int | None,
                defaults: SamplingParams) -> CommonRequest:
    """The shared fields; `max_tokens` and `logprobs` are the endpoint's, read under its own names."""
    _accept_openai_only(fields)
    common = CommonRequest(
        model=model,
        n=fields.get_int("n", 1, N),
        stream=_read_stream(fields),
        user=fields.get_str("user", None),
        sampling=read_sampling(fields, max_tokens, logprobs, defaults),
    )
    if common.stream.stream and common.sampling.prompt_logprobs is not None:
        # Departure from vLLM, which sends them in the first chunk: here they come in full responses only.
        raise unsupported("prompt_logprobs", "is not supported with stream (ask without streaming)")
    return common


def read_sampling(fields: Fields, max_tokens: int | None, logprobs: int | None,
                  defaults: SamplingParams) -> SamplingParams:
    """The request's SamplingParams, `defaults` for the sampling fields it leaves out. A rule between fields
    (min_tokens <= max_tokens, non-empty stop strings) is SamplingParams' own, and names its field, which is the
    client's name for it."""
    top_k = fields.get_int("top_k", None, REQUEST_TOP_K)
    try:
        return SamplingParams(
            temperature=fields.get_float("temperature", defaults.temperature, TEMPERATURE),
            top_p=fields.get_float("top_p", defaults.top_p, TOP_P),
            top_k=defaults.top_k if top_k is None else top_k if top_k > 0 else None,
            min_p=fields.get_float("min_p", defaults.min_p, MIN_P),
            seed=fields.get_int("seed", None, SEED),
            max_tokens=max_tokens,
            min_tokens=fields.get_int("min_tokens", 0, MIN_TOKENS),
            stop=fields.str_list("stop"),
            stop_token_ids=fields.int_list("stop_token_ids"),
            ignore_eos=fields.get_bool("ignore_eos", False),
            logprobs=logprobs,
            skip_special_tokens=fields.get_bool("skip_special_tokens", True),
            include_stop_str_in_output=fields.get_bool("include_stop_str_in_output", False),
            presence_penalty=fields.get_float("presence_penalty", 0.0, PRESENCE_PENALTY),
            frequency_penalty=fields.get_float("frequency_penalty", 0.0, FREQUENCY_PENALTY),
            repetition_penalty=fields.get_float("repetition_penalty", defaults.repetition_penalty,
                                                REPETITION_PENALTY),
            logit_bias=_read_logit_bias(fields),
            structured_output=read_structured_output(fields),
            prompt_logprobs=fields.get_int("prompt_logprobs", None, LOGPROBS),
        )
    except SamplingParamsError as exc:
        raise refused(exc) from exc


def _read_logit_bias(fields: Fields) -> dict[int, float]:
    """OpenAI's map of token ids (as JSON object keys, so strings) to a bias in [-100, 100]."""
    value = fields.raw("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    bias = {}
    for key, number in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise bad_request(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias")
        if not is_number(number) or not LOGIT_BIAS.admits(number):
            raise bad_request(f"'logit_bias' values must be numbers {LOGIT_BIAS}, got {number!r}", "logit_bias")
        bias[int(key)] = float(number)
    return bias


def choice_params(params: SamplingParams, choice_index: int) -> SamplingParams:
    """Choice i of a seeded request samples with seed + i (wrapped into the seed's range), as in vLLM, so that its
    choices differ."""
    if params.seed is None or choice_index == 0:
        return params
    return replace(params, seed=offset_seed(params.seed, choice_index))


def _read_stream(fields: Fields) -> StreamOptions:
    stream = fields.get_bool("stream", False)
    options = fields.get_object("stream_options")
    if options is None:
        return StreamOptions(stream=stream)
    if not stream:
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    include_usage = options.get_bool("include_usage", False)
    continuous = options.get_bool("continuous_usage_stats", False)
    options.check_unknown()
    return StreamOptions(stream=True, include_usage=include_usage, continuous_usage_stats=include_usage and continuous)


def _accept_openai_only(fields: Fields) -> None:
    """OpenAI's fields that mean nothing to one local server (storing, billing tiers, caching hints,
    predicted outputs, abuse ids): accepted when they have the right type, and unused."""
    for key in ("service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"):
        fields.get_str(key, None)
    fields.get_bool("store", None)
    for key in ("metadata", "prediction", "prompt_cache_options", "moderation"):
        fields.typed(key, _is_object, "an object", None)


def _is_object(value: object) -> bool:
    return isinstance(value, dict)
