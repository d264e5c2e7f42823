"""Each family's real chat template (tests/data/chat_templates/, where each came from in its README),
through the server's chat-template path: `auto` picks the family's parser from it; it renders the
request's tools and a tool result; and the call it writes into the conversation's history, read back
by that parser, is the call the client sent (the format the parser reads is the one the template
teaches)."""

import json
import os
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from openai_serve.chat_template import ChatTemplate
from openai_serve.parsers.deltas import fold
from openai_serve.parsers.selection import OutputParsing
from openai_serve.parsers.tool_parsers import parser_name_for_template
from openai_serve.protocol.chat import parse_chat_request
from tests.parsers.cases import TOOLS

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
# The README's table: each template file and the parser `auto` picks from it.
_README_ROW = re.compile(r"^\| `([^`]+\.jinja)` \|[^|]+\| `(\w+)` \|$", re.MULTILINE)
FAMILY_TEMPLATES = _README_ROW.findall((TEMPLATES / "README.md").read_text())
# DeepSeek's templates leave the tools' definitions to the system prompt; they render calls and results.
WITHOUT_TOOL_DEFINITIONS = {"deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"}
CALL_ID = "abcDEF123"  # 9 letters and digits: Mistral's templates take no other ids
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT = {"role": "tool", "tool_call_id": CALL_ID, "content": "18 C, sunny"}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_dir)


def render(tokenizer: PreTrainedTokenizerBase, template: str, messages: list[dict[str, object]],
           add_generation_prompt: bool = True) -> str:
    body = {"model": "m", "messages": messages, "tools": TOOLS, "add_generation_prompt": add_generation_prompt,
            "chat_template_kwargs": {"enable_thinking": False}}
    return ChatTemplate(tokenizer, template).render(parse_chat_request(body))


def test_the_readme_lists_every_template() -> None:
    assert sorted(file for file, _ in FAMILY_TEMPLATES) == sorted(path.name for path in TEMPLATES.glob("*.jinja"))
    assert len(FAMILY_TEMPLATES) == 12


@pytest.mark.parametrize(("file", "parser_name"), FAMILY_TEMPLATES)
def test_auto_picks_the_familys_parser(file: str, parser_name: str) -> None:
    assert parser_name_for_template((TEMPLATES / file).read_text()) == parser_name


@pytest.mark.parametrize(("file", "parser_name"), FAMILY_TEMPLATES)
def test_the_template_renders_the_tools_and_a_tool_result(
    tokenizer: PreTrainedTokenizerBase, file: str, parser_name: str
) -> None:
    prompt = render(tokenizer, (TEMPLATES / file).read_text(), [QUESTION, CALL, RESULT])
    assert "What is the weather in Paris?" in prompt and "18 C, sunny" in prompt
    assert "get_weather" in prompt
    if file not in WITHOUT_TOOL_DEFINITIONS:
        assert "get_time" in prompt and "The time in a time zone" in prompt  # a tool not called: its definition


@pytest.mark.parametrize(("file", "parser_name"), FAMILY_TEMPLATES)
def test_the_call_the_template_writes_is_the_call_its_parser_reads(
    tokenizer: PreTrainedTokenizerBase, file: str, parser_name: str
) -> None:
    template = (TEMPLATES / file).read_text()
    history = render(tokenizer, template, [QUESTION, CALL], add_generation_prompt=False)
    prompt = render(tokenizer, template, [QUESTION])
    common = os.path.commonprefix([history, prompt])
    start = max(common.rfind(">"), common.rfind("]")) + 1  # not inside a tag the two share the start of
    written = history[start:]  # the assistant's turn, as the model writes it
    parsing = OutputParsing(parse_chat_request({"model": "m", "messages": [QUESTION], "tools": TOOLS}).tools,
                            parser_name, None, prompt)
    parser = parsing.new_parser()
    assert parser is not None
    message = fold(parser.feed(written) + parser.finish())
    calls = [(call.name, json.loads(call.arguments)) for call in message.tool_calls]
    assert calls == [("get_weather", {"city": "Paris"})], written
