"""Request parsing and validation without a server: shapes accepted, and 400s that name the field."""

from collections.abc import Callable

import pytest

from openai_serve.errors import APIError
from openai_serve.protocol.chat import parse_chat_request
from openai_serve.protocol.common import choice_params
from openai_serve.protocol.completions import DEFAULT_MAX_TOKENS, parse_completion_request

C = {"model": "m", "prompt": "hi"}
M = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def param_of(parse: Callable[[object], object], body: object) -> str | None:
    with pytest.raises(APIError) as err:
        parse(body)
    assert err.value.status_code == 400
    return err.value.param


@pytest.mark.parametrize(("prompt", "parsed"), [
    ("hi", ("hi",)),
    (["a", "b"], ("a", "b")),
    ([1, 2, 3], ((1, 2, 3),)),
    ([[1], [2, 3]], ((1,), (2, 3))),
])
def test_the_four_prompt_forms(prompt: object, parsed: tuple) -> None:
    assert parse_completion_request(C | {"prompt": prompt}).prompts == parsed


def test_nulls_mean_defaults() -> None:
    nulls = {k: None for k in ("max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "logprobs",
                               "echo", "user", "presence_penalty", "logit_bias", "suffix", "best_of")}
    request = parse_completion_request(C | nulls)
    assert request.max_tokens == DEFAULT_MAX_TOKENS and request.common.n == 1 and request.logprobs is None
    assert request.common.sampling.temperature == 1.0 and request.common.sampling.stop == ()


def test_booleans_are_not_numbers_and_integers_are_not_floats() -> None:
    assert param_of(parse_completion_request, C | {"max_tokens": True}) == "max_tokens"
    assert param_of(parse_completion_request, C | {"max_tokens": 2.0}) == "max_tokens"
    assert parse_completion_request(C | {"temperature": 1}).common.sampling.temperature == 1.0


def test_unknown_fields_are_named_even_when_nested() -> None:
    assert param_of(parse_completion_request, C | {"foo": 1}) == "foo"
    body = M | {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]}
    assert param_of(parse_chat_request, body) == "messages[0].content[0].extra"


def test_top_k_spellings_of_no_limit_and_seed_per_choice() -> None:
    request = parse_completion_request(C | {"top_k": -1, "seed": 10, "n": 3})
    params = [choice_params(request.common.sampling, i) for i in range(3)]
    assert [p.top_k for p in params] == [None] * 3 and [p.seed for p in params] == [10, 11, 12]
    assert parse_completion_request(C | {"top_k": 0}).common.sampling.top_k is None
    assert parse_completion_request(C | {"top_k": 5}).common.sampling.top_k == 5



@pytest.mark.parametrize("parse", [parse_completion_request, parse_chat_request])
def test_seeds_are_signed_64_bit_and_a_choices_seed_wraps_into_that_range(parse: Callable[[object], object]) -> None:
    body = C if parse is parse_completion_request else M
    largest = parse(body | {"seed": 2**63 - 1, "n": 3}).common.sampling  # type: ignore[attr-defined]
    assert [choice_params(largest, i).seed for i in range(3)] == [2**63 - 1, -(2**63), -(2**63) + 1]
    smallest = parse(body | {"seed": -(2**63), "n": 2}).common.sampling  # type: ignore[attr-defined]
    assert [choice_params(smallest, i).seed for i in range(2)] == [-(2**63), -(2**63) + 1]
    for seed in (2**63, 2**64 - 1, -(2**63) - 1):
        assert param_of(parse, body | {"seed": seed, "n": 2}) == "seed"

def test_sampling_params_errors_become_400s_naming_the_field() -> None:
    assert param_of(parse_completion_request, C | {"top_p": 1.5}) == "top_p"


def test_chat_messages_are_normalized_for_templates() -> None:
    body = M | {"messages": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]}
    assert parse_chat_request(body).messages == (
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb", "name": "ann"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    )


def test_chat_logprobs_and_token_limits() -> None:
    assert parse_chat_request(M).logprobs is None and parse_chat_request(M).max_tokens is None
    assert parse_chat_request(M | {"logprobs": True}).logprobs == 0
    assert parse_chat_request(M | {"logprobs": True, "top_logprobs": 4}).logprobs == 4
    assert parse_chat_request(M | {"max_completion_tokens": 7}).max_tokens == 7
    assert parse_chat_request(M | {"max_tokens": 7, "max_completion_tokens": 7}).max_tokens == 7
    assert param_of(parse_chat_request, M | {"logprobs": False, "top_logprobs": 1}) == "top_logprobs"


@pytest.mark.parametrize("body", [[], "x", None, 3])
def test_non_object_bodies(body: object) -> None:
    assert param_of(parse_chat_request, body) is None
    assert param_of(parse_completion_request, body) is None
