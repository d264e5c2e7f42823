"""Every parser against its family's recorded answers (cases.py), through the path a chat request takes
(OutputParsing, then the chat route's JSON): the message in full must be the expected one, and the
stream, fed in many chunkings (whole, a character at a time, splits inside every tag, random cuts,
UTF-8 bytes cut anywhere and decoded as the server does), must add up to exactly that message, as an
OpenAI client adds up the chunks."""

import json
import re
from dataclasses import replace

import pytest

from openai_serve.chat_output import delta_json, message_json
from openai_serve.parsers.deltas import fold
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.fields import Fields
from openai_serve.protocol.tools import read_tools
from tests.parsers.cases import FAMILIES, TOOLS, Case, Family
from tests.parsers.chunkings import chunkings

CASES = [pytest.param(family, case, id=f"{family.tool_call_parser}-{case.name}")
         for family in FAMILIES for case in family.cases]


def parsing(family: Family, case: Case) -> OutputParsing:
    tools = read_tools(Fields({"tools": TOOLS}))
    return OutputParsing(tools, family.tool_call_parser, family.reasoning_parser, case.prompt)


def in_full(family: Family, case: Case) -> tuple[dict[str, object], bool]:
    parser = parsing(family, case).new_parser()
    assert parser is not None
    message = message_json(fold(parser.feed(case.text) + parser.finish()), has_reasoning=True)
    return message, parser.has_tool_calls


def streamed(family: Family, case: Case, pieces: list[str]) -> tuple[list[dict[str, object]], bool]:
    """The chunks' deltas as the chat route makes them, one per piece (the last with what `finish` holds)."""
    parser = parsing(family, case).new_parser()
    assert parser is not None
    chunks = [delta_json(parser.feed(piece)) for piece in pieces[:-1]]
    chunks.append(delta_json(parser.feed(pieces[-1]) + parser.finish()))
    return [chunk for chunk in chunks if chunk], parser.has_tool_calls


def client_message(chunks: list[dict[str, object]]) -> dict[str, object]:
    """What an OpenAI client makes of the stream: texts concatenated, calls by index (id, name, then arguments)."""
    content, reasoning, calls = "", "", {}
    for chunk in chunks:
        content += chunk.get("content", "")  # type: ignore[operator]
        reasoning += chunk.get("reasoning_content", "")  # type: ignore[operator]
        for entry in chunk.get("tool_calls", []):  # type: ignore[attr-defined]
            call = calls.setdefault(entry["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in entry:
                assert call["id"] is None and entry["type"] == "function", "a call opens once, with its id and name"
                call["id"], call["name"] = entry["id"], entry["function"]["name"]
            else:
                assert call["id"] is not None, "a call's arguments came before its id and name"
            call["arguments"] += entry["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)]}


def expected_calls(message: dict[str, object]) -> list[tuple[str, object]]:
    calls = message.get("tool_calls") or []
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]  # type: ignore[index, union-attr]


@pytest.mark.parametrize(("family", "case"), CASES)
def test_the_answer_in_full_is_the_recorded_message(family: Family, case: Case) -> None:
    message, has_tool_calls = in_full(family, case)
    assert (message["content"], message["reasoning_content"]) == (case.content, case.reasoning)
    assert expected_calls(message) == case.calls
    assert has_tool_calls == bool(case.calls)  # finish_reason "tool_calls" exactly when there are calls
    ids = [call["id"] for call in message.get("tool_calls", [])]  # type: ignore[union-attr]
    assert len(set(ids)) == len(ids)
    pattern = r"[A-Za-z0-9]{9}" if family.tool_call_parser == "mistral" else r"call_[0-9a-f]{24}"
    assert all(re.fullmatch(pattern, call_id) for call_id in ids)  # Mistral's templates take 9 characters only


@pytest.mark.parametrize(("family", "case"), CASES)
def test_the_stream_adds_up_to_the_answer_in_full(family: Family, case: Case) -> None:
    message, has_tool_calls = in_full(family, case)
    for way, pieces in chunkings(case.text).items():
        chunks, streamed_calls = streamed(family, case, pieces)
        got = client_message(chunks)
        assert got["content"] == (message["content"] or ""), way
        assert got["reasoning"] == (message["reasoning_content"] or ""), way
        assert [(c["name"], c["arguments"]) for c in got["calls"]] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])], way
        assert streamed_calls == has_tool_calls, way


def test_gpt_oss_answers_are_split_into_channels_without_tools_too() -> None:
    """Channels are gpt-oss's format, not an option: with no tools (or tool_choice none) analysis is still
    reasoning and final still content, and a call (none was offered) is content."""
    text = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi."
            "<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}")
    for request in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        no_tools = OutputParsing(read_tools(Fields(request)), "harmony", None, "")
        parser = no_tools.new_parser()
        assert parser is not None and no_tools.has_reasoning
        message = fold(parser.feed(text) + parser.finish())
        assert (message.reasoning, message.content, message.tool_calls) == ("Think.", "Hi.{}", [])


@pytest.mark.parametrize("family", [pytest.param(f, id=f.tool_call_parser) for f in FAMILIES])
def test_without_parallel_calls_only_the_first_call_is_kept(family: Family) -> None:
    case = next(case for case in family.cases if case.name == "parallel calls")
    tools = read_tools(Fields({"tools": TOOLS, "parallel_tool_calls": False}))
    parser = OutputParsing(tools, family.tool_call_parser, family.reasoning_parser, case.prompt).new_parser()
    assert parser is not None
    message = fold(parser.feed(case.text) + parser.finish())
    assert [(call.name, json.loads(call.arguments)) for call in message.tool_calls] == case.calls[:1]


@pytest.mark.parametrize("family", [pytest.param(f, id=f.tool_call_parser) for f in FAMILIES])
def test_a_call_that_breaks_off_reads_the_same_streamed(family: Family) -> None:
    """Without a grammar a model may break a call it began: it is still the call it began (with what was
    read of its arguments), and however the text is cut, the same."""
    one_call = next(case for case in family.cases if case.name == "one call")
    what, instead = family.broken
    assert what in one_call.text
    case = replace(one_call, text=one_call.text.replace(what, instead) + " Then text.")
    message, _ = in_full(family, case)
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["get_weather"]  # type: ignore[union-attr]
    for way, pieces in chunkings(case.text).items():
        got = client_message(streamed(family, case, pieces)[0])
        assert got["content"] == (message["content"] or ""), way
        assert [(c["name"], c["arguments"]) for c in got["calls"]] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]], way  # type: ignore[union-attr]
