"""The engine's limits as the front ends check them: each rule once, errors naming the field as
the caller's client sent it."""

import pytest

from core import RequestRejected, SamplingParams, SamplingParamsError
from core.request_checks import EngineLimits
from core.sampling_params import TOP_P, Bounds

LIMITS = EngineLimits(vocab_size=100, max_model_len=50, block_size=16, num_blocks=4)


def param_of(check: object, *args: object) -> str:
    with pytest.raises(RequestRejected) as error:
        check(*args)  # type: ignore[operator]
    return error.value.param


def test_prompt_rules_name_the_callers_field() -> None:
    assert param_of(LIMITS.check_prompt, [], "messages") == "messages"
    assert param_of(LIMITS.check_prompt, [5, 100], "prompt") == "prompt"
    assert param_of(LIMITS.check_prompt, [-1], "prompt") == "prompt"
    assert param_of(LIMITS.check_prompt, [5] * 50, "messages") == "messages"  # no room to generate
    assert param_of(LIMITS.check_token_ids, [0, 99, 100], "tokens") == "tokens"
    LIMITS.check_prompt([0, 99] * 24, "prompt")
    LIMITS.check_token_ids([], "tokens")


def test_fit_resolves_max_tokens_or_names_the_callers_field() -> None:
    assert LIMITS.fit(10, SamplingParams(max_tokens=None)).max_tokens == 40  # the rest of the context
    same = SamplingParams(max_tokens=5)
    assert LIMITS.fit(10, same) is same
    assert param_of(LIMITS.fit, 10, SamplingParams(max_tokens=41), "max_completion_tokens") == "max_completion_tokens"
    small = EngineLimits(vocab_size=100, max_model_len=50, block_size=16, num_blocks=2)
    with pytest.raises(RequestRejected, match="KV-cache blocks"):
        small.fit(30, SamplingParams(max_tokens=3))
    small.fit(30, SamplingParams(max_tokens=2))  # 32 tokens: exactly 2 blocks


def test_bounds_and_sampling_params_state_each_range_once() -> None:
    assert not TOP_P.admits(0.0) and TOP_P.admits(1.0) and not TOP_P.admits(1.01)
    assert str(TOP_P) == "in (0.0, 1.0]" and str(Bounds(1)) == ">= 1"
    with pytest.raises(SamplingParamsError) as error:
        SamplingParams(top_p=0.0)
    assert error.value.param == "top_p"
    with pytest.raises(SamplingParamsError) as error:
        SamplingParams(max_tokens=3, min_tokens=4)
    assert error.value.param == "min_tokens"


def test_stop_strings_stay_with_the_front_end() -> None:
    params = SamplingParams(stop=("x",), seed=3)
    assert params.for_engine() == SamplingParams(seed=3)
    plain = SamplingParams()
    assert plain.for_engine() is plain
