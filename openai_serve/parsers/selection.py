"""Which parsers a chat request's answers go through, and what they need of its sampling: decided once
per request, one parser per choice.

A forced `tool_choice` (required, named) is read by the forced parsers, since structured output shaped
the answer (and thinking is not split then: the answer is JSON from its first token). `auto` uses
the server's tool-call parser; `none` no tool parser. The reasoning parser, when the server has one,
runs first and hands the tool parser only the content. gpt-oss's harmony format carries reasoning,
calls and content in one stream: its parser reads every answer, with or without tools.

`sampling` is what the parsers ask of the request's sampling: under `auto`, the format's lazy grammar
(call_grammar.py), so a call the model opens is one of the tools, with arguments its schema allows;
and the special tokens kept in the answer's text where the format's tags are special tokens. The
grammar stays off where the request shapes its output otherwise (response_format), asks for tokens
no grammar may end early (min_tokens, ignore_eos), or has a schema the grammar engine cannot take:
its calls are then parsed as the model writes them, as before.
"""

import logging
from dataclasses import dataclass, replace

from core import grammar
from core.sampling_params import SamplingParams
from core.structured_output import StructuredOutputError
from openai_serve.parsers.forced import NamedToolParser, RequiredToolParser
from openai_serve.parsers.harmony import HarmonyParser
from openai_serve.parsers.message import MessageParser
from openai_serve.parsers.reasoning import HARMONY_NAMES, NEEDS_SPECIAL_TOKENS, ReasoningParser
from openai_serve.parsers.tool_call_grammar import structural_tag
from openai_serve.parsers.tool_parsers import FORMATS, FirstCallOnly, ToolCallParser, parser_name_for_template
from openai_serve.protocol.tools import ToolChoice, ToolRequest

logger = logging.getLogger(__name__)


def resolve_tool_call_parser(setting: str, template: str | None) -> str | None:
    """`--tool-call-parser` as a parser name, or None for no parsing."""
    if setting == "auto":
        return parser_name_for_template(template)
    return None if setting == "none" else setting


@dataclass(frozen=True)
class OutputParsing:
    tools: ToolRequest
    tool_call_parser: str | None  # resolved: a name in FORMATS, or None
    reasoning_parser: str | None
    prompt: str  # the rendered prompt: where it ends tells where thinking starts

    @property
    def is_harmony(self) -> bool:
        return self.tool_call_parser == "harmony" or self.reasoning_parser in HARMONY_NAMES

    @property
    def has_reasoning(self) -> bool:
        return (self.reasoning_parser is not None or self.is_harmony) and not self.tools.is_forced

    @property
    def parses_calls(self) -> bool:
        """The model's own calls are read (`auto` with a parser), not forced ones."""
        return self.tools.choice is ToolChoice.AUTO and self.tool_call_parser is not None

    def new_parser(self) -> MessageParser | None:
        """A parser for one choice's answer; None when its text is all content."""
        if self.is_harmony and not self.tools.is_forced:
            harmony = HarmonyParser(parses_calls=self.parses_calls)
            return MessageParser(None, harmony if self.tools.parallel_tool_calls else FirstCallOnly(harmony))
        tools = self._tool_parser()
        reasoning = ReasoningParser(self.reasoning_parser, self.prompt) if self.has_reasoning else None  # type: ignore[arg-type]
        if tools is None and reasoning is None:
            return None
        return MessageParser(reasoning, tools)

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """`params` as the parsers need them (see the module's docstring)."""
        if self._needs_special_tokens() and params.skip_special_tokens:
            params = replace(params, skip_special_tokens=False)
        call_format = FORMATS[self.tool_call_parser] if self.parses_calls else None  # type: ignore[index]
        if call_format is None:
            return params
        if params.structured_output is not None or params.min_tokens or params.ignore_eos:
            return params
        constraint = structural_tag(call_format.call_grammar(self.tools.tools, self.tools.parallel_tool_calls))
        try:
            grammar.check(constraint)
        except StructuredOutputError as exc:
            logger.warning("tool calls are not held to their schemas for this request: %s", exc)
            return params
        return replace(params, structured_output=constraint)

    def _needs_special_tokens(self) -> bool:
        if self.tools.is_forced:
            return False
        tools_need = self.parses_calls and FORMATS[self.tool_call_parser].needs_special_tokens  # type: ignore[index]
        return tools_need or self.is_harmony or self.reasoning_parser in NEEDS_SPECIAL_TOKENS

    def _tool_parser(self) -> ToolCallParser | None:
        choice = self.tools.choice
        if choice is ToolChoice.NAMED:
            return NamedToolParser(self.tools.named)  # type: ignore[arg-type]
        if choice is ToolChoice.REQUIRED:
            return RequiredToolParser()
        if not self.parses_calls:
            return None
        parser = FORMATS[self.tool_call_parser].new_parser(self.tools.tools)  # type: ignore[index]
        return parser if self.tools.parallel_tool_calls else FirstCallOnly(parser)
