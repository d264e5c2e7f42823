"""Tool-call parsers: the model's text in, content and tool-call deltas out (deltas.py).

Named as vLLM names them (`--tool-call-parser`): `hermes` (`<tool_call>` JSON: Hermes, Qwen2.5,
Qwen3), `llama3_json` (Llama 3.x JSON calls); `auto` picks one from what the chat template asks the
model to write, and none when the template shows neither (tools still reach the template; the answer
is then content). `tool_choice` required or named does not use these: structured output shapes the
answer and forced.py reads it.
"""

from collections.abc import Callable
from typing import Protocol

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.hermes import START as HERMES_START
from openai_serve.parsers.hermes import HermesToolParser
from openai_serve.parsers.llama3_json import PYTHON_TAG, Llama3JsonToolParser


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[MessageDelta]:
        """The deltas that the text so far settles (text that may start a tag waits)."""
        ...

    def finish(self) -> list[MessageDelta]:
        """What was still waiting, once the answer is complete."""
        ...


PARSERS: dict[str, Callable[[], ToolCallParser]] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}
PARSER_CHOICES = ("auto", "none", *PARSERS)


def parser_name_for_template(template: str | None) -> str | None:
    """`auto`: the parser for the format the chat template shows the model (None: no known one)."""
    if template is None:
        return None
    if HERMES_START in template:
        return "hermes"
    if PYTHON_TAG in template or '"parameters": dictionary of argument name' in template:
        return "llama3_json"
    return None


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
