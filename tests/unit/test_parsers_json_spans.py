"""JsonSpans: the raw span of each value, whatever pieces the text arrives in."""

from hypothesis import given
from hypothesis import strategies as st

from openai_serve.parsers.json_spans import JsonSpans, Span

CALL = '{"name": "f", "arguments": {"a": [1, 2], "b": "x}\\"{"}, "n": -1.5e3, "t": true} </tool_call>'


def scan(pieces: list[str], max_depth: int = 1) -> JsonSpans:
    spans = JsonSpans(max_depth=max_depth)
    for piece in pieces:
        spans.feed(piece)
    return spans


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def test_spans_of_a_complete_object():
    spans = scan([CALL])
    assert spans.complete(("name",)) == '"f"'
    assert spans.complete(("arguments",)) == '{"a": [1, 2], "b": "x}\\"{"}'
    assert spans.complete(("n",)) == "-1.5e3"
    assert spans.complete(("t",)) == "true"
    assert spans.end == CALL.index(" </tool_call>")  # what follows the value is left alone
    assert ("arguments", "a") not in spans.spans  # deeper than max_depth


def test_deeper_spans_when_asked():
    spans = scan(['[{"name": "f", "parameters": {}}, {"name": "g"}]'], max_depth=2)
    assert spans.complete((0, "name")) == '"f"'
    assert spans.complete((0, "parameters")) == "{}"
    assert spans.complete((1, "name")) == '"g"'
    assert spans.spans[(1,)].end is not None and spans.end is not None


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_the_same_spans_whatever_the_pieces(cuts: list[int]):
    whole = scan([CALL])
    pieces = scan(split(CALL, cuts))
    assert pieces.spans == whole.spans and pieces.end == whole.end and not pieces.is_invalid


def test_an_open_value_has_a_start_and_no_end():
    spans = scan(['{"name": "f", "arguments": {"a": "x\\'])
    assert spans.complete(("name",)) == '"f"'
    assert spans.spans[("arguments",)] == Span(start=27, end=None)
    assert spans.end is None and not spans.is_invalid


def test_a_number_at_the_end_of_the_text_may_still_go_on():
    spans = scan(['{"n": 12'])
    assert spans.spans[("n",)].end is None
    spans.feed("3}")
    assert spans.complete(("n",)) == "123"


def test_text_that_is_not_json_is_invalid():
    assert scan(['{"a" 1}']).is_invalid
    assert scan(["{'a': 1}"]).is_invalid
    assert scan(['{"a": 1]']).is_invalid
    assert scan(["hello"]).is_invalid
