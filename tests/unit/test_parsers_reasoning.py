"""Reasoning parsers: <think> blocks into reasoning, the rest into content, however it is streamed."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openai_serve.parsers.deltas import fold
from openai_serve.parsers.hermes import HermesToolParser
from openai_serve.parsers.message import MessageParser
from openai_serve.parsers.reasoning import ReasoningParser

CHATML_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def parse(parser_name: str, prompt: str, pieces: list[str]) -> tuple[str, str]:
    parser = ReasoningParser(parser_name, prompt)
    message = fold([d for piece in pieces for d in parser.feed(piece)] + parser.finish())
    return message.reasoning, message.content


@pytest.mark.parametrize("parser_name", ["qwen3", "deepseek_r1"])
def test_a_think_block_then_content(parser_name: str):
    text = "<think>\nFirst, 2 < 3.\n</think>\n\nThe answer is 3."
    assert parse(parser_name, CHATML_PROMPT, [text]) == ("\nFirst, 2 < 3.\n", "The answer is 3.")
    assert parse(parser_name, CHATML_PROMPT, list(text)) == ("\nFirst, 2 < 3.\n", "The answer is 3.")


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_the_same_split_however_it_is_streamed(cuts: list[int]):
    text = "  <think>a </thin b</think>c <think> d"
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(points, points[1:], strict=False)]
    assert parse("qwen3", CHATML_PROMPT, pieces) == ("a </thin b", "c <think> d")


def test_a_prompt_that_opened_the_block_starts_in_reasoning():
    assert parse("qwen3", CHATML_PROMPT + "<think>\n", ["a</think>b"]) == ("a", "b")


def test_thinking_switched_off_in_the_prompt_is_all_content():
    prompt = CHATML_PROMPT + "<think>\n\n</think>\n\n"
    assert parse("qwen3", prompt, ["no <think>thinking</think>"]) == ("", "no <think>thinking</think>")
    assert parse("deepseek_r1", prompt, ["plain"]) == ("", "plain")


def test_without_tags_qwen3_is_content_and_deepseek_r1_is_reasoning():
    assert parse("qwen3", CHATML_PROMPT, ["just words"]) == ("", "just words")
    assert parse("deepseek_r1", CHATML_PROMPT, ["thoughts</think>words"]) == ("thoughts", "words")


def test_thinking_that_never_closes_is_all_reasoning():
    assert parse("qwen3", CHATML_PROMPT, ["<think>on and on"]) == ("on and on", "")


def test_unknown_parser_name():
    with pytest.raises(ValueError, match="qwen3"):
        ReasoningParser("o1", CHATML_PROMPT)


def test_tool_calls_after_thinking():
    parser = MessageParser(ReasoningParser("qwen3", CHATML_PROMPT), HermesToolParser())
    text = '<think>call it</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    message = fold([d for ch in text for d in parser.feed(ch)] + parser.finish())
    assert message.reasoning == "call it" and message.content == ""
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("f", '{"x": 1}')]
    assert parser.has_tool_calls
