"""Token-id prompts are validated at C speed (a thousand ids per request, on the event loop): the
same answers as an element-by-element check, bools and floats included. The parser checks their
shape; which ids exist, and that a prompt is not empty, the engine's limits say once they are tokens
(core/request_checks.py), as for prompts that were text."""

import pytest

from core import RequestRejected
from core.request_checks import EngineLimits
from openai_serve.errors import APIError
from openai_serve.protocol.completions import parse_completion_request
from openai_serve.protocol.fields import are_ints

C = {"model": "m"}
LIMITS = EngineLimits(vocab_size=1024, max_model_len=4096, block_size=16, num_blocks=1024)


@pytest.mark.parametrize("prompt", [[1, True, 3], [1, 2.0, 3], [0, "1"], [[1, 2], [3, False]], [[1], [None]]])
def test_a_token_prompt_with_anything_but_ints_is_a_400(prompt: object) -> None:
    with pytest.raises(APIError) as err:
        parse_completion_request(C | {"prompt": prompt})
    assert err.value.status_code == 400 and err.value.param == "prompt"


@pytest.mark.parametrize("prompt", [[1, -1], [[1, 2], [-3]], [[1], []], [[1], [1024]]])
def test_a_token_prompt_with_an_unknown_id_or_none_is_refused_naming_it(prompt: list) -> None:
    prompts = parse_completion_request(C | {"prompt": prompt}).prompts
    with pytest.raises(RequestRejected) as err:
        for token_ids in prompts:
            LIMITS.check_prompt(token_ids, "prompt")  # type: ignore[arg-type]
    assert err.value.param == "prompt"


def test_token_prompts_are_kept_as_sent() -> None:
    ids = list(range(1024))
    assert parse_completion_request(C | {"prompt": ids}).prompts == (tuple(ids),)
    assert parse_completion_request(C | {"prompt": [[0], ids]}).prompts == ((0,), tuple(ids))


@pytest.mark.parametrize(("values", "expected"), [
    ([], True), ([0, 7, -2], True), ([1, True], False), ([False], False), ([1.0], False), ([1, None], False),
    ([2**70], True),
])
def test_are_ints_is_is_int_for_every_value(values: list[object], expected: bool) -> None:
    assert are_ints(values) is expected
