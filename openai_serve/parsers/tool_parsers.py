"""Tool-call parsers: the model's text in, content and tool-call deltas out (deltas.py).

Named as vLLM names them (`--tool-call-parser`), one `ToolCallFormat` each: `hermes` (`<tool_call>`
JSON: Hermes, Qwen2.5, Qwen3), `llama3_json` (Llama 3.x JSON calls), `qwen3_coder` (Qwen3-Coder,
Qwen3.5 XML), `harmony` (gpt-oss), `mistral`, `glm45` (GLM-4.5 to 4.7), `deepseek_v3` and
`deepseek_v31`, `kimi_k2`. `auto` picks one from what the chat template asks the model to write, and
none when the template shows none of them (tools still reach the template; the answer is then
content). `tool_choice` required or named does not use these: structured output shapes the answer
and forced.py reads it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from openai_serve.parsers import deepseek_v3, glm45, harmony, kimi_k2, mistral, qwen3_coder
from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.hermes import HermesToolParser
from openai_serve.parsers.hermes import call_grammar as hermes_call_grammar
from openai_serve.parsers.llama3_json import PYTHON_TAG, Llama3JsonToolParser
from openai_serve.parsers.llama3_json import call_grammar as llama3_call_grammar
from openai_serve.parsers.marked_calls import MarkedCallsParser, MarkedSyntax
from openai_serve.parsers.tool_call_grammar import Format
from openai_serve.protocol.tools import Tool


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[MessageDelta]:
        """The deltas that the text so far settles (text that may start a tag waits)."""
        ...

    def finish(self) -> list[MessageDelta]:
        """What was still waiting, once the answer is complete."""
        ...


@dataclass(frozen=True)
class ToolCallFormat:
    """How one family writes tool calls: the parser that reads them and, for `auto` tool choice, the lazy
    grammar (tool_call_grammar.py) that holds each call to the tools' schemas once the model opens it."""

    new_parser: Callable[[tuple[Tool, ...]], ToolCallParser]
    call_grammar: Callable[[tuple[Tool, ...], bool], Format]  # (tools, parallel) -> grammar
    # Its tags are special tokens, which the text of an answer leaves out unless told to keep them.
    needs_special_tokens: bool = False


def _marked(syntax: MarkedSyntax) -> Callable[[tuple[Tool, ...]], ToolCallParser]:
    return lambda tools: MarkedCallsParser(syntax)


FORMATS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat(lambda tools: HermesToolParser(), hermes_call_grammar),
    "llama3_json": ToolCallFormat(lambda tools: Llama3JsonToolParser(), llama3_call_grammar),
    "qwen3_coder": ToolCallFormat(qwen3_coder.new_parser, qwen3_coder.call_grammar),
    "harmony": ToolCallFormat(harmony.new_parser, harmony.call_grammar, needs_special_tokens=True),
    "mistral": ToolCallFormat(mistral.new_parser, mistral.call_grammar, needs_special_tokens=True),
    "glm45": ToolCallFormat(glm45.new_parser, glm45.call_grammar, needs_special_tokens=True),
    "deepseek_v3": ToolCallFormat(_marked(deepseek_v3.SYNTAX), deepseek_v3.v3_call_grammar, needs_special_tokens=True),
    "deepseek_v31": ToolCallFormat(_marked(deepseek_v3.SYNTAX), deepseek_v3.v31_call_grammar,
                                   needs_special_tokens=True),
    "kimi_k2": ToolCallFormat(_marked(kimi_k2.SYNTAX), kimi_k2.call_grammar, needs_special_tokens=True),
}
PARSER_CHOICES = ("auto", "none", *FORMATS)

# What a chat template shows of each format (any of the alternatives, each all of its marks), most specific
# first: several families wrap calls in `<tool_call>` (hermes, qwen3_coder, glm45), so what is inside it
# decides; DeepSeek V3's templates write its older form's code fence.
_TEMPLATE_MARKS: tuple[tuple[tuple[tuple[str, ...], ...], str], ...] = (
    (((harmony.TEMPLATE_MARK,),), "harmony"),
    (((qwen3_coder.TEMPLATE_MARK,),), "qwen3_coder"),
    (((glm45.TEMPLATE_MARK,),), "glm45"),
    (((kimi_k2.SECTION_BEGIN,),), "kimi_k2"),
    (((deepseek_v3.SECTION_BEGIN, "```json"),), "deepseek_v3"),
    (((deepseek_v3.SECTION_BEGIN,),), "deepseek_v31"),
    (((mistral.TRIGGER,),), "mistral"),
    ((("<tool_call>",),), "hermes"),
    (((PYTHON_TAG,), ('"parameters": dictionary of argument name',)), "llama3_json"),
)


def parser_name_for_template(template: str | None) -> str | None:
    """`auto`: the parser for the format the chat template shows the model (None: no known one)."""
    if template is None:
        return None
    return next((name for alternatives, name in _TEMPLATE_MARKS
                 if any(all(mark in template for mark in marks) for marks in alternatives)), None)


class FirstCallOnly:
    """`parallel_tool_calls: false`: a second call and any after it are dropped."""

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser

    def feed(self, text: str) -> list[MessageDelta]:
        return self._first_only(self._parser.feed(text))

    def finish(self) -> list[MessageDelta]:
        return self._first_only(self._parser.finish())

    @staticmethod
    def _first_only(deltas: list[MessageDelta]) -> list[MessageDelta]:
        return [d for d in deltas if d.tool_call is None or d.tool_call.index == 0]
