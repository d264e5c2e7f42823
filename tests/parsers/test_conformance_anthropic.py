"""Every parser against its family's recorded answers (cases.py), through the path a /v1/messages request
takes: the Anthropic request's tools into OutputParsing, and the answer's text into content blocks and
stream events by the route's own MessageRun. The message in full must have the expected blocks
(`thinking`, `text`, `tool_use` with its parsed `input`) and `stop_reason`; the stream, fed in every
chunking of chunkings.py, must add up to exactly those blocks as an Anthropic client adds up the events
(each block's deltas concatenated; a tool_use's `partial_json` pieces to JSON equal to its `input`), and
the official SDK's accumulator must make the same message of it."""

import asyncio
import json
import re
from collections.abc import AsyncIterator
from types import SimpleNamespace

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event

from openai_serve.anthropic_blocks import thinking_signature
from openai_serve.anthropic_message import MessageRun
from openai_serve.choice import ChoiceDelta
from openai_serve.generation import Usage
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.anthropic_request import parse_messages_request
from tests.parsers.cases import FAMILIES, TOOLS, Case, Family
from tests.parsers.chunkings import chunkings

CASES = [pytest.param(family, case, id=f"{family.tool_call_parser}-{case.name}")
         for family in FAMILIES for case in family.cases]
ANTHROPIC_TOOLS = [{"name": tool["function"]["name"], "description": tool["function"]["description"],
                    "input_schema": tool["function"]["parameters"]} for tool in TOOLS]
_DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json",
                 "signature_delta": "signature"}
Event = dict[str, object]


class RecordedGeneration:
    """What MessageRun reads of a Generation, for an answer whose text arrives in these pieces: one wake-up
    per piece, the last with the finish reason (an answer that ended by itself, not at a stop string)."""

    def __init__(self, pieces: list[str]) -> None:
        self._pieces = pieces
        self.decoders = [SimpleNamespace(tracker=SimpleNamespace(stop_string=None))]

    async def batches(self) -> AsyncIterator[list[ChoiceDelta]]:
        for i, piece in enumerate(self._pieces):
            yield [ChoiceDelta(0, piece, finish_reason="stop" if i == len(self._pieces) - 1 else None)]

    def usage(self) -> Usage:
        return Usage(prompt_tokens=7, completion_tokens=len(self._pieces), cached_tokens=0)


def run_message(family: Family, case: Case, pieces: list[str],
                tool_choice: dict[str, object] | None = None) -> tuple[list[Event], dict[str, object]]:
    """The stream's events and the message in full, as the route makes them for this answer."""
    request = {"model": "m", "max_tokens": 1000, "tools": ANTHROPIC_TOOLS,
               "messages": [{"role": "user", "content": "Weather?"}]}
    body = parse_messages_request(request if tool_choice is None else {**request, "tool_choice": tool_choice})
    run = MessageRun(body, OutputParsing(body.tools, family.tool_call_parser, family.reasoning_parser, case.prompt))

    async def all_events() -> list[Event]:
        return [event async for batch in run.events(RecordedGeneration(pieces)) for event in batch]  # type: ignore[arg-type]

    events = asyncio.run(all_events())
    return events, run.message()


def expected_blocks(case: Case) -> list[dict[str, object]]:
    """The case's message as Anthropic's blocks, in the order the model wrote them (tool_use ids left out)."""
    blocks: list[dict[str, object]] = []
    if case.reasoning:
        blocks.append({"type": "thinking", "thinking": case.reasoning, "signature": thinking_signature(case.reasoning)})
    if case.content:
        blocks.append({"type": "text", "text": case.content})
    return blocks + [{"type": "tool_use", "name": name, "input": arguments} for name, arguments in case.calls]


def without_ids(blocks: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{key: value for key, value in block.items() if key != "id"} for block in blocks]


def client_blocks(events: list[Event]) -> tuple[list[dict[str, object]], object]:
    """What an Anthropic client makes of the stream: each block from its start and its deltas (a tool_use's
    input from its partial_json concatenated), checking the event sequence on the way; and the stop reason."""
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    blocks: list[dict[str, object]] = []
    pieces: dict[str, list[str]] = {}
    for event in events[2:-2]:
        kind, index = event["type"], event["index"]
        if kind == "content_block_start":
            assert index == len(blocks) and not pieces, "a block starts after the one before it stopped"
            blocks.append(dict(event["content_block"]))  # type: ignore[arg-type]
            pieces = {key: [] for key in _DELTA_FIELDS.values()}
        elif kind == "content_block_delta":
            assert index == len(blocks) - 1 and pieces, "a delta is for the open block"
            delta = event["delta"]
            pieces[_DELTA_FIELDS[delta["type"]]].append(delta[_DELTA_FIELDS[delta["type"]]])  # type: ignore[index]
        else:
            assert kind == "content_block_stop" and index == len(blocks) - 1 and pieces
            blocks[-1] = _ended(blocks[-1], pieces)
            pieces = {}
    assert not pieces, "every block stops before the message does"
    return blocks, events[-2]["delta"]["stop_reason"]  # type: ignore[index]


def _ended(block: dict[str, object], pieces: dict[str, list[str]]) -> dict[str, object]:
    if block["type"] == "tool_use":
        assert block["input"] == {} and not pieces["text"] and not pieces["thinking"]
        return {**block, "input": json.loads("".join(pieces["partial_json"]))}
    if block["type"] == "thinking":
        assert len(pieces["signature"]) == 1 and not pieces["text"] and not pieces["partial_json"]
        return {**block, "thinking": "".join(pieces["thinking"]), "signature": pieces["signature"][0]}
    assert not pieces["thinking"] and not pieces["partial_json"] and not pieces["signature"]
    return {**block, "text": "".join(pieces["text"])}


def sdk_content(events: list[Event]) -> list[dict[str, object]]:
    """The message's content as the official SDK accumulates the stream."""
    snapshot, json_bufs = None, {}  # type: ignore[var-annotated]
    for event in events:
        snapshot = accumulate_event(event=orjson.loads(orjson.dumps(event)), current_snapshot=snapshot,
                                    json_bufs=json_bufs)
    assert snapshot is not None
    return [block.to_dict(exclude_none=True) for block in snapshot.content]


@pytest.mark.parametrize(("family", "case"), CASES)
def test_the_message_in_full_has_the_recorded_blocks(family: Family, case: Case) -> None:
    _, message = run_message(family, case, [case.text])
    content: list[dict[str, object]] = message["content"]  # type: ignore[assignment]
    assert without_ids(content) == expected_blocks(case)
    assert message["stop_reason"] == ("tool_use" if case.calls else "end_turn")
    ids = [block["id"] for block in content if block["type"] == "tool_use"]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"toolu_[0-9a-f]{24}", str(i)) for i in ids)


@pytest.mark.parametrize(("family", "case"), CASES)
def test_the_stream_adds_up_to_the_message_in_full(family: Family, case: Case) -> None:
    _, in_full = run_message(family, case, [case.text])
    for way, pieces in chunkings(case.text).items():
        events, message = run_message(family, case, pieces)
        blocks, stop_reason = client_blocks(events)
        assert blocks == message["content"], way  # the stream and the message it builds agree
        assert without_ids(blocks) == without_ids(in_full["content"]), way  # type: ignore[arg-type]
        assert stop_reason == message["stop_reason"] == in_full["stop_reason"], way
        assert sdk_content(events) == message["content"], way


@pytest.mark.parametrize("family", [pytest.param(f, id=f.tool_call_parser) for f in FAMILIES])
def test_without_parallel_tool_use_only_the_first_call_is_a_block(family: Family) -> None:
    case = next(case for case in family.cases if case.name == "parallel calls")
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    for way, pieces in {"whole": [case.text], "characters": list(case.text)}.items():
        events, message = run_message(family, case, pieces, choice)
        assert client_blocks(events) == (message["content"], "tool_use"), way
        calls = [(b["name"], b["input"]) for b in message["content"] if b["type"] == "tool_use"]  # type: ignore[union-attr, index]
        assert calls == case.calls[:1], way
