"""The harmony parser against OpenAI's own: answers rendered by the `openai-harmony` package (gpt-oss's
renderer) are read by our parser, fed token by token as the server decodes them, into what
openai-harmony's parser reads from the same tokens (analysis as reasoning, final and preambles as
content, commentary to `functions.NAME` as calls); and the lazy grammar takes them.

openai-harmony loads the o200k vocabulary by downloading it, or from `TIKTOKEN_ENCODINGS_BASE`, checked
against its SHA-256 either way. With no download here, the file is rebuilt from the ranks the
`quicktok-v1` package ships (openai-harmony's hash check says it is the same file)."""

import base64
import os
import struct
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as accepts

from core.sampling_params import SamplingParams
from openai_serve.parsers.deltas import fold
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.fields import Fields
from openai_serve.protocol.tools import read_tools
from tests.parsers.cases import TOOLS

harmony = pytest.importorskip("openai_harmony")
pytest.importorskip("quicktok")
Role, Message = harmony.Role, harmony.Message
STOP_TOKENS = ("<|call|>", "<|return|>")  # the model's stop tokens: the server leaves their text out


def o200k_vocabulary(directory: Path) -> Path:
    """o200k_base.tiktoken (base64 of each token's bytes and its rank, a line each) from quicktok's ranks."""
    data = (resources.files("quicktok") / "data" / "o200k.vocab").read_bytes()
    (count,), position, lines = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (size,) = struct.unpack_from("<H", data, position)
        token = data[position + 2:position + 2 + size]
        (rank,) = struct.unpack_from("<I", data, position + 2 + size)
        lines.append((rank, f"{base64.b64encode(token).decode()} {rank}\n"))
        position += 6 + size
    path = directory / "o200k_base.tiktoken"
    path.write_text("".join(line for _, line in sorted(lines)))
    return path


@pytest.fixture(scope="module")
def encoding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    directory = tmp_path_factory.mktemp("tiktoken")
    o200k_vocabulary(directory)
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    try:
        yield harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if before is None:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


def analysis(text: str) -> object:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")


def final(text: str) -> object:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final")


def preamble(text: str) -> object:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary")


def call(name: str, arguments: str) -> object:
    message = Message.from_role_and_content(Role.ASSISTANT, arguments).with_channel("commentary")
    return message.with_recipient(f"functions.{name}").with_content_type("<|constrain|>json")


ANSWERS = {
    "final": [final("Bonjour, ça va? 東京 is 18 °C.")],
    "analysis then final": [analysis("Greet back; 2 < 3."), final("Hello!")],
    "analysis then call": [analysis("Need the weather for 東京."), call("get_weather", '{"city": "東京", "days": 2}')],
    "preamble then call": [preamble("Let me check."), call("get_time", '{"zone": "UTC"}')],
    "two analyses then final": [analysis("First."), analysis("Second."), final("Done.")],
}


def completion(encoding: object, messages: list[object]) -> list[int]:
    """The answer's tokens after a prompt that ends with `<|start|>assistant` (the chat template's)."""
    tokens = [token for message in messages for token in encoding.render(message)]  # type: ignore[attr-defined]
    return tokens[2:]  # <|start|> and "assistant" are the prompt's


def token_texts(encoding: object, tokens: list[int]) -> list[str]:
    """The text each token adds, as the server's incremental detokenizer hands it out."""
    texts, previous = [], ""
    for end in range(1, len(tokens) + 1):
        text = encoding.decode(tokens[:end])  # type: ignore[attr-defined]
        if not text.endswith("\ufffd"):  # half a character waits for the rest
            texts.append(text[len(previous):])
            previous = text
    return texts


def harmony_reading(encoding: object, tokens: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) as openai-harmony's parser reads the answer."""
    reasoning, content, calls = "", "", []
    for message in encoding.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT):  # type: ignore[attr-defined]
        text = "".join(part.text for part in message.content)
        if message.recipient and message.recipient.startswith("functions."):
            calls.append((message.recipient.removeprefix("functions."), text))
        elif message.channel == "analysis":
            reasoning += text
        else:
            content += text
    return reasoning, content, calls


def our_reading(pieces: list[str]) -> tuple[str, str, list[tuple[str, str]]]:
    parser = OutputParsing(read_tools(Fields({"tools": TOOLS})), "harmony", None, "<|start|>assistant").new_parser()
    assert parser is not None
    message = fold([delta for piece in pieces for delta in parser.feed(piece)] + parser.finish())
    return message.reasoning, message.content, [(c.name, c.arguments) for c in message.tool_calls]


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_our_parser_reads_what_openai_harmony_reads(encoding: object, answer: str) -> None:
    tokens = completion(encoding, ANSWERS[answer])
    expected = harmony_reading(encoding, tokens)
    pieces = token_texts(encoding, tokens)
    assert our_reading(pieces) == expected
    if pieces[-1] in STOP_TOKENS:
        assert our_reading(pieces[:-1]) == expected  # as the server sends it: without the stop token's text
    assert our_reading(["".join(pieces)]) == expected


@pytest.mark.parametrize("answer", ["analysis then call", "preamble then call"])
def test_the_lazy_grammar_takes_openai_harmonys_calls(encoding: object, answer: str) -> None:
    constraint = OutputParsing(read_tools(Fields({"tools": TOOLS})), "harmony", None, "").sampling(SamplingParams())
    grammar = xgr.Grammar.from_structural_tag(constraint.structured_output.structural_tag)  # type: ignore[union-attr]
    text = encoding.decode(completion(encoding, ANSWERS[answer]))  # type: ignore[attr-defined]
    assert accepts(grammar, text)
    assert not accepts(grammar, text.replace('"days": 2', '"days": "2"').replace('"zone": "UTC"', '"zone": 0'))
