"""POST /v1/completions: the request body, parsed and validated.

A prompt is a string, an array of strings, an array of token ids, or an array of arrays of token
ids; each prompt gets `n` choices, numbered prompt by prompt (prompt i, choice j: index i*n + j).
"""

from dataclasses import dataclass, replace
from typing import ClassVar

from core.sampling_defaults import SERVER_DEFAULTS
from core.sampling_params import LOGPROBS, MAX_TOKENS, SamplingParams
from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.common import GenerationRequest, read_common, read_model
from openai_serve.protocol.fields import Fields, UnknownFields, are_ints

Prompt = str | tuple[int, ...]
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint, where the model states none


@dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    prompts: tuple[Prompt, ...]
    echo: bool = False
    add_special_tokens: bool = True  # vLLM's extra: tokenize string prompts with BOS etc.
    prompt_logprobs: int | None = None  # vLLM's `prompt_logprobs` as the client asked (echo may ask for more)
    ignored_fields: tuple[str, ...] = ()  # unknown fields the request sent (see fields.py)
    # The client's names for the prompt and for max_tokens, in errors about them.
    prompt_param: ClassVar[str] = "prompt"
    max_tokens_param: ClassVar[str] = "max_tokens"


def parse_completion_request(body: object, unknown: UnknownFields | None = None,
                             defaults: SamplingParams = SERVER_DEFAULTS) -> CompletionRequest:
    """`unknown`: where fields nobody reads go (None: each is a 400, as `--strict-request-fields`); `defaults`: what
    the sampling fields the request leaves out take."""
    fields = Fields(body, unknown=unknown)
    model = read_model(fields)
    endpoint_default = DEFAULT_MAX_TOKENS if defaults.max_tokens is None else None  # None: the model's
    max_tokens = fields.get_int("max_tokens", endpoint_default, MAX_TOKENS)
    logprobs = fields.get_int("logprobs", None, LOGPROBS)
    common = read_common(fields, model, max_tokens, logprobs, defaults)
    request = CompletionRequest(
        common=common,
        prompts=parse_prompts(fields.raw("prompt")),
        echo=fields.get_bool("echo", False),
        add_special_tokens=fields.get_bool("add_special_tokens", True),
        prompt_logprobs=common.sampling.prompt_logprobs,
    )
    fields.unsupported_unless("suffix", lambda v: v == "", "is not supported by this server")
    best_of = fields.get_int("best_of", None)
    if best_of is not None and best_of != common.n:
        raise unsupported("best_of", f"must equal n ({common.n}): picking the best of several is not supported")
    if common.stream.stream and request.echo and request.logprobs is not None:
        raise unsupported("echo", "with logprobs needs prompt logprobs, which are not streamed (ask without stream)")
    if request.echo and request.logprobs is not None:
        # The legacy API's log-likelihood pattern: the prompt's tokens get logprobs too (the first null).
        sampling = common.sampling
        wanted = max(request.logprobs, sampling.prompt_logprobs or 0)
        request = replace(request, common=replace(common, sampling=replace(sampling, prompt_logprobs=wanted)))
    return replace(request, ignored_fields=fields.ignored_fields())


def parse_prompts(prompt: object, param: str = "prompt") -> tuple[Prompt, ...]:
    """The prompts' shapes; what their tokens must be (not empty, known ids) the route checks once
    they are tokens, with the engine's limits (core/request_checks.py). `param`: the field's name
    (the embeddings endpoint's is `input`)."""
    if prompt is None:
        raise bad_request(f"you must provide a {param} parameter", param)
    if isinstance(prompt, str):
        return (prompt,)
    if not isinstance(prompt, list) or not prompt:
        raise bad_request(f"'{param}' must be a non-empty string or a non-empty array", param)
    if all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    if are_ints(prompt):
        return (tuple(prompt),)
    if all(isinstance(p, list) and are_ints(p) for p in prompt):
        return tuple(tuple(p) for p in prompt)
    raise bad_request(
        f"'{param}' must be a string, an array of strings, an array of token ids or an array of arrays of "
        "token ids", param,
    )
