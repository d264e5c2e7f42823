"""Any text, not only well-formed answers: texts made of each family's tags, pieces of them, names, JSON,
whitespace and multi-byte characters, in any order. No parser raises on them, and however a text is cut,
the stream adds up to the answer in full."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parsers.cases import FAMILIES, Family
from tests.parsers.chunkings import cut
from tests.parsers.test_conformance import client_message, in_full, streamed

COMMON = ["get_weather", "get_time", '{"city": "Paris"}', "{", "}", '"', ":", ",", " ", "\n", "é", "東京", "x",
          "<think>", "</think>", "<", ">", "[", "]", "|", "=", "3", "```json\n", "\n```"]
TAGS = {
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
                    "<function=get_weather>", "<parameter=city>"],
    "hermes": ["<tool_call>", "</tool_call>", '{"name": "get_weather", "arguments": ', '"arguments"'],
    "llama3_json": ["<|python_tag|>", '{"name": "get_weather", "parameters": ', '"parameters"', ";", "; "],
    "glm45": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
              "<tool_call>get_weather", "<arg_key>city</arg_key>"],
    "deepseek_v31": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>", "｜", "▁", "function<｜tool▁sep｜>"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>", "function<｜tool▁sep｜>"],
    "kimi_k2": ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_end|>", "<|tool_call_argument_begin|>", "functions.get_weather:0"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "[TOOL_CALLS][", "abc123XYZ"],
    "harmony": ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>", "<|constrain|>",
                "analysis", "final", "commentary", " to=functions.get_weather", "assistant", "json"],
}


def texts(family: Family) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(COMMON + TAGS[family.tool_call_parser]), max_size=40).map("".join)


@pytest.mark.parametrize("family", [pytest.param(f, id=f.tool_call_parser) for f in FAMILIES])
def test_any_text_parses_the_same_however_it_iscut(family: Family) -> None:
    case = family.cases[0]

    @settings(max_examples=150, deadline=None)
    @given(texts(family), st.lists(st.integers(min_value=1, max_value=400), max_size=12))
    def check(text: str, cuts: list[int]) -> None:
        whole = case.__class__(case.name, text, prompt=case.prompt)
        message, has_tool_calls = in_full(family, whole)
        chunks, streamed_calls = streamed(family, whole, cut(text, [c % (len(text) + 1) for c in cuts]) or [""])
        got = client_message(chunks)
        assert got["content"] == (message["content"] or "")
        assert got["reasoning"] == (message["reasoning_content"] or "")
        assert [(c["name"], c["arguments"]) for c in got["calls"]] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert streamed_calls == has_tool_calls

    check()
