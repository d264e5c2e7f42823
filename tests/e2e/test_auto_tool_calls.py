"""`tool_choice: auto` on the real default model, SmolLM2-135M-Instruct, sampled over many seeds: with
the lazy grammar, every call the model opens is one of the tools, with arguments that parse and
validate against its schema, and the stream adds up to the same calls as the answer in full; without
it, the same seeds leave broken calls behind as content.

SmolLM2's own template shows no tools, so the server runs a Hermes-style one (`--tool-call-parser auto`
then picks `hermes`). A model this small seldom opens a call by itself: the conversation shows it one
call and its result, and `logit_bias` nudges it toward `<` and `call` (the tokens of `<tool_call>`);
what follows `<tool_call>` is the grammar's doing, not the nudge's."""

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from tests.chat_templates import HERMES_TOOLS_TEMPLATE
from tests.e2e.serving import RunningServer, server_config, start_server
from tests.parsers.cases import TOOLS

NAME = "smollm2-135m-instruct"
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
EARLIER_CALL = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}
MESSAGES = [
    {"role": "system", "content": "You are a weather assistant. Call a tool to answer."},
    {"role": "user", "content": "What is the weather in Paris for the next 3 days?"},
    {"role": "assistant", "content": None, "tool_calls": [EARLIER_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
    {"role": "user", "content": "And the weather in Rome for 2 days?"},
]
NUM_SEEDS = 24  # one request, n choices: choice i samples with the request's seed + i
REQUEST = {"model": NAME, "messages": MESSAGES, "tools": TOOLS, "temperature": 0.8, "seed": 7, "n": NUM_SEEDS,
           "max_tokens": 48, "logit_bias": {"44": 4, "4350": 6}}  # SmolLM2's ids of "<" and "call"


@pytest.fixture(scope="module")
def smollm2_with_tools(smollm2_dir: Path) -> Iterator[RunningServer]:
    config = server_config(served_model_names=(NAME,), chat_template=HERMES_TOOLS_TEMPLATE)
    running = start_server(smollm2_dir, config, max_model_len=2048)
    yield running
    running.stop()


def complete_calls(finish_reason: str, calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The calls the model finished: the last of an answer cut off by max_tokens may be cut off too."""
    return calls[:-1] if finish_reason == "length" else calls


def test_every_call_the_model_opens_parses_and_validates(smollm2_with_tools: RunningServer) -> None:
    response = smollm2_with_tools.client().chat.completions.create(**REQUEST)  # type: ignore[call-overload]
    assert len(response.choices) == NUM_SEEDS
    validated = 0
    for choice in response.choices:
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        for name, arguments in complete_calls(choice.finish_reason, calls):
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
            validated += 1
        assert (choice.finish_reason == "tool_calls") == (bool(calls) and choice.finish_reason != "length")
        if choice.finish_reason != "length":  # every call the model opened was read as one
            assert "<tool_call>" not in (choice.message.content or "")
    assert validated >= NUM_SEEDS // 6, f"only {validated} complete calls in {NUM_SEEDS} answers: the test shows little"

    streamed = stream_by_choice(smollm2_with_tools)
    for choice in response.choices:  # the same seeds, streamed: the same calls, piece for piece
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert streamed[choice.index] == (choice.message.content or "", calls, choice.finish_reason)


def test_without_the_grammar_the_same_model_breaks_calls(smollm2_with_tools: RunningServer) -> None:
    """The contrast that shows the grammar at work: `min_tokens` turns it off (no grammar may end an answer
    early), and the same seeds then leave calls the model opened but did not finish as content."""
    response = smollm2_with_tools.client().chat.completions.create(  # type: ignore[call-overload]
        **REQUEST, extra_body={"min_tokens": 1})
    broken = [c for c in response.choices if c.finish_reason != "length" and "<tool_call>" in (c.message.content or "")]
    assert broken


def stream_by_choice(server: RunningServer) -> dict[int, tuple[str, list[tuple[str, str]], str | None]]:
    content: dict[int, str] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    finish: dict[int, str | None] = {}
    for chunk in server.client().chat.completions.create(**REQUEST, stream=True):  # type: ignore[call-overload]
        for choice in chunk.choices:
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(choice.index, {}).setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    return {index: (text, [tuple(c) for _, c in sorted(calls.get(index, {}).items())], finish.get(index))
            for index, text in content.items()}  # type: ignore[misc]
