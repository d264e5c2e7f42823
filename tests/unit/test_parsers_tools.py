"""Tool-call parsers: the calls and content of an answer, and the same ones however it is streamed."""

import json

from hypothesis import given
from hypothesis import strategies as st

from openai_serve.parsers.deltas import AssistantMessage, MessageDelta, fold
from openai_serve.parsers.forced import NamedToolParser, RequiredToolParser
from openai_serve.parsers.hermes import HermesToolParser
from openai_serve.parsers.llama3_json import Llama3JsonToolParser
from openai_serve.parsers.tool_parsers import FirstCallOnly, ToolCallParser, parser_name_for_template

HERMES = (
    'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "n": [1, {"x": "}"}]}}\n'
    '</tool_call>\n<tool_call>\n{"arguments": {"q": "a\\"b <tool_call>"}, "name": "search"}\n</tool_call>\n'
)
LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", "parameters": {}}'


def run(parser: ToolCallParser, pieces: list[str]) -> list[MessageDelta]:
    deltas = [delta for piece in pieces for delta in parser.feed(piece)]
    return deltas + parser.finish()


def calls(message: AssistantMessage) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in message.tool_calls]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def test_hermes_calls_and_the_text_before_them():
    message = fold(run(HermesToolParser(), [HERMES]))
    assert message.content == "Let me check."
    assert calls(message) == [("get_weather", '{"city": "Paris", "n": [1, {"x": "}"}]}'),
                              ("search", '{"q": "a\\"b <tool_call>"}')]
    assert all(call.id.startswith("call_") for call in message.tool_calls)
    assert len({call.id for call in message.tool_calls}) == 2


@given(st.lists(st.integers(min_value=0), max_size=20))
def test_hermes_the_same_answer_however_it_is_streamed(cuts: list[int]):
    expected = fold(run(HermesToolParser(), [HERMES]))
    got = fold(run(HermesToolParser(), split(HERMES, cuts)))
    assert (got.content, calls(got)) == (expected.content, calls(expected))


def test_a_call_opens_with_its_id_and_name_then_its_arguments_in_pieces():
    deltas = [d.tool_call for d in run(HermesToolParser(), list(HERMES)) if d.tool_call is not None]
    first = [d for d in deltas if d.index == 0]
    assert first[0].name == "get_weather" and first[0].id and first[0].arguments == ""
    assert all(d.name is None and d.id is None for d in first[1:])
    assert len(first) > 5  # the arguments went out as the model wrote them, not at the end
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)


def test_hermes_without_calls_is_all_content():
    text = "  Hello <tool  world, <tool_cal \n"
    assert fold(run(HermesToolParser(), list(text))) == AssistantMessage(content=text)


def test_hermes_a_tool_call_tag_around_what_is_not_a_call_is_content():
    for body in ("<tool_call>not json</tool_call>", '<tool_call>{"arguments": {}}</tool_call>'):
        message = fold(run(HermesToolParser(), [body]))
        assert message.tool_calls == [] and message.content.startswith("<tool_call>"), body


def test_hermes_a_call_cut_short_keeps_what_was_written():
    message = fold(run(HermesToolParser(), ['<tool_call>{"name": "f", "arguments": {"a": "unfinis']))
    assert calls(message) == [("f", '{"a": "unfinis')] and message.content == ""


def test_hermes_a_call_without_arguments_gets_an_empty_object():
    assert calls(fold(run(HermesToolParser(), ['<tool_call>{"name": "now"}</tool_call>']))) == [("now", "{}")]


def test_llama3_json_calls_after_the_python_tag():
    message = fold(run(Llama3JsonToolParser(), [LLAMA]))
    assert calls(message) == [("get_weather", '{"city": "Paris"}'), ("now", "{}")] and message.content == ""


@given(st.lists(st.integers(min_value=0), max_size=20))
def test_llama3_json_the_same_answer_however_it_is_streamed(cuts: list[int]):
    text = LLAMA.removeprefix("<|python_tag|>") + " and some words"
    expected = fold(run(Llama3JsonToolParser(), [text]))
    assert calls(expected)[1] == ("now", "{}") and expected.content == "and some words"
    got = fold(run(Llama3JsonToolParser(), split(text, cuts)))
    assert (got.content, calls(got)) == (expected.content, calls(expected))


def test_llama3_json_prose_is_content():
    text = 'The answer is {"name": "x"}'
    assert fold(run(Llama3JsonToolParser(), list(text))) == AssistantMessage(content=text)


def test_named_tool_choice_the_whole_answer_is_the_arguments():
    message = fold(run(NamedToolParser("get_weather"), [" ", '{"city": ', '"Paris"}', "\n"]))
    assert calls(message) == [("get_weather", '{"city": "Paris"}')] and message.content == ""


def test_required_tool_choice_an_array_of_calls():
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    for pieces in ([text], list(text)):
        message = fold(run(RequiredToolParser(), pieces))
        assert calls(message) == [("f", '{"a": 1}'), ("g", "{}")]
        assert all(json.loads(arguments) is not None for _, arguments in calls(message))


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    assert calls(fold(run(FirstCallOnly(HermesToolParser()), [HERMES])))[0][0] == "get_weather"
    assert len(calls(fold(run(FirstCallOnly(HermesToolParser()), [HERMES])))) == 1


def test_auto_picks_the_parser_from_the_chat_template():
    assert parser_name_for_template("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}") == "hermes"
    assert parser_name_for_template("{{- '<|python_tag|>' }}") == "llama3_json"
    assert parser_name_for_template("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert parser_name_for_template(None) is None
