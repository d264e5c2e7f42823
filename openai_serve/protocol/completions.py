"""POST /v1/completions: the request body, parsed and validated.

A prompt is a string, an array of strings, an array of token ids, or an array of arrays of token
ids; each prompt gets `n` choices, numbered prompt by prompt (prompt i, choice j: index i*n + j).
"""

from dataclasses import dataclass

from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.common import CommonRequest, check_logprobs, read_common
from openai_serve.protocol.fields import Fields, are_ints

Prompt = str | tuple[int, ...]
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


@dataclass(frozen=True)
class CompletionRequest:
    common: CommonRequest
    prompts: tuple[Prompt, ...]
    max_tokens: int
    echo: bool = False
    logprobs: int | None = None  # top alternatives per token; None: no logprobs
    add_special_tokens: bool = True  # vLLM's extra: tokenize string prompts with BOS etc.


def parse_completion_request(body: object) -> CompletionRequest:
    fields = Fields(body)
    common = read_common(fields)
    request = CompletionRequest(
        common=common,
        prompts=parse_prompts(fields.raw("prompt")),
        max_tokens=fields.get_int("max_tokens", DEFAULT_MAX_TOKENS, minimum=1),
        echo=fields.get_bool("echo", False),
        logprobs=check_logprobs(fields.get_int("logprobs", None), "logprobs"),
        add_special_tokens=fields.get_bool("add_special_tokens", True),
    )
    fields.unsupported_unless("suffix", lambda v: v == "", "is not supported by this server")
    best_of = fields.get_int("best_of", None)
    if best_of is not None and best_of != common.n:
        raise unsupported("best_of", f"must equal n ({common.n}): picking the best of several is not supported")
    if request.echo and request.logprobs is not None:
        raise unsupported("echo", "with logprobs needs prompt logprobs, which this server does not compute")
    fields.reject_unknown()
    return request


def parse_prompts(prompt: object) -> tuple[Prompt, ...]:
    if prompt is None:
        raise bad_request("you must provide a prompt parameter", "prompt")
    if isinstance(prompt, str):
        return (_non_empty_text(prompt),)
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("'prompt' must be a non-empty string or a non-empty array", "prompt")
    if all(isinstance(p, str) for p in prompt):
        return tuple(_non_empty_text(p) for p in prompt)
    if are_ints(prompt):
        return (_token_prompt(prompt),)
    if all(isinstance(p, list) for p in prompt):
        return tuple(_token_prompt(p) for p in prompt)
    raise bad_request(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of "
        "token ids", "prompt",
    )


def _non_empty_text(text: str) -> str:
    if not text:
        raise bad_request("'prompt' must not be empty", "prompt")
    return text


def _token_prompt(token_ids: list[object]) -> tuple[int, ...]:
    if not token_ids:
        raise bad_request("'prompt' must not be empty", "prompt")
    if not are_ints(token_ids) or min(token_ids) < 0:  # type: ignore[type-var]
        raise bad_request("token ids in 'prompt' must be non-negative integers", "prompt")
    return tuple(token_ids)  # type: ignore[arg-type]
