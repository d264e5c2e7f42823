"""Token-id prompts are validated at C speed (a thousand ids per request, on the event loop): the
same answers as an element-by-element check, bools and floats included."""

import pytest

from openai_serve.errors import APIError
from openai_serve.protocol.completions import parse_completion_request
from openai_serve.protocol.fields import are_ints

C = {"model": "m"}


@pytest.mark.parametrize("prompt", [
    [1, True, 3], [1, 2.0, 3], [1, -1], [0, "1"], [[1, 2], [3, False]], [[1, 2], [-3]], [[1], []], [[1], [None]],
])
def test_a_token_prompt_with_anything_but_non_negative_ints_is_a_400(prompt: object) -> None:
    with pytest.raises(APIError) as err:
        parse_completion_request(C | {"prompt": prompt})
    assert err.value.status_code == 400 and err.value.param == "prompt"


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
