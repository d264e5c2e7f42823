"""`harmony`: gpt-oss writes its answer as messages in channels, each
`<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>TEXT<|end|>`, the next after
`<|start|>assistant` (the recipient may stand before the channel: `<|start|>assistant
to=functions.f<|channel|>commentary json<|message|>`). The analysis channel is reasoning, the final
channel content; a commentary message to `functions.NAME` is a call of NAME whose text is its JSON
arguments; a commentary message to no one (a preamble) is content. A call ends the answer with
`<|call|>` and a final message with `<|return|>`, the model's stop tokens, whose text the server
leaves out. Text that is not in this format is content, as written.

gpt-oss's answers are always in this format, so with it they go through this parser with or without
tools (without, a call is content: no tool was offered).
"""

from enum import Enum

import regex

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta, new_tool_call_id
from openai_serve.parsers.json_spans import JsonSpans
from openai_serve.parsers.partial_match import MAX_HEAD_CHARS, Found, find
from openai_serve.parsers.stepping import SteppingParser
from openai_serve.parsers.tags import split_at_any
from openai_serve.parsers.tool_call_grammar import Format, json_arguments, tag, triggered
from openai_serve.protocol.tools import Tool

TEMPLATE_MARK = "<|channel|>"
FUNCTIONS = "functions."
TRIGGER = "to=" + FUNCTIONS
ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")  # what ends a message's text

# A message's header, up to its text: the role after <|start|>, a recipient, a channel, a content type.
HEADER = regex.compile(r"(?:<\|start\|>)?(?P<header>(?:\s*(?:to=[^\s<]+|<\|channel\|>\w+|<\|constrain\|>\w+|\w+))*)"
                       r"\s*<\|message\|>")
_CHANNEL = regex.compile(r"<\|channel\|>(\w+)")
_RECIPIENT = regex.compile(r"to=([^\s<]+)")


class _State(Enum):
    HEADER = "header"
    TEXT = "text"  # a message's text: reasoning or content
    CALL = "call"  # a call's JSON arguments
    AFTER_CALL = "after call"  # what follows the arguments, up to the message's end
    CONTENT = "content"  # not in the format: all the rest is content


class HarmonyParser(SteppingParser):
    def __init__(self, parses_calls: bool) -> None:
        super().__init__()
        self._parses_calls = parses_calls
        self._state = _State.HEADER
        self._is_reasoning = False  # the message being read is analysis
        self._num_calls = 0
        self._arguments = JsonSpans(max_depth=0)
        self._num_sent = 0

    def finish(self) -> list[MessageDelta]:
        pending = self._take_pending()
        if self._state is _State.CALL:
            return [] if self._num_sent else self._close_call()
        if not pending or self._state is _State.AFTER_CALL:
            return []
        if self._state is _State.TEXT and self._is_reasoning:
            return [MessageDelta(reasoning=pending)]
        return [MessageDelta(content=pending)]

    def _step(self, deltas: list[MessageDelta]) -> bool:
        if self._state is _State.HEADER:
            return self._read_header(deltas)
        if self._state is _State.TEXT:
            return self._read_text(deltas)
        if self._state is _State.CALL:
            return self._read_call(deltas)
        if self._state is _State.AFTER_CALL:
            return self._read_after_call()
        return self._send_content(deltas)

    def _read_header(self, deltas: list[MessageDelta]) -> bool:
        found = find(self._pending, 0, HEADER, limit=MAX_HEAD_CHARS)
        if found is Found.WAIT:
            return False
        if found is Found.NONE:
            self._state = _State.CONTENT
            return True
        header = found["header"]  # type: ignore[index]
        self._pending = self._pending[found.end():]  # type: ignore[union-attr]
        channel, recipient = _CHANNEL.search(header), _RECIPIENT.search(header)
        if recipient is not None and recipient[1].startswith(FUNCTIONS) and self._parses_calls:
            name = recipient[1][len(FUNCTIONS):]
            deltas.append(MessageDelta(tool_call=ToolCallDelta(self._num_calls, new_tool_call_id(), name)))
            self._arguments, self._num_sent, self._state = JsonSpans(max_depth=0), 0, _State.CALL
            return True
        self._is_reasoning = channel is not None and channel[1] == "analysis"
        self._state = _State.TEXT
        return True

    def _read_text(self, deltas: list[MessageDelta]) -> bool:
        before, end, after = split_at_any(self._pending, ENDS)
        if before:
            deltas.append(MessageDelta(reasoning=before) if self._is_reasoning else MessageDelta(content=before))
        if end is None:
            self._pending = after
            return False
        self._next_message(end, after)
        return True

    def _next_message(self, end: str, after: str) -> None:
        self._pending = end + after if end == "<|start|>" else after
        self._state = _State.HEADER

    def _read_call(self, deltas: list[MessageDelta]) -> bool:
        arguments = self._arguments
        arguments.feed(self._take_pending())
        span = arguments.spans.get(())
        if span is not None:  # JSON that breaks off: the arguments are what was read of it
            end = arguments.position if arguments.is_invalid else len(arguments.text) if arguments.end is None \
                else arguments.end
            piece = arguments.text[span.start + self._num_sent:end]
            self._num_sent += len(piece)
            if piece:
                deltas.append(MessageDelta(tool_call=ToolCallDelta(self._num_calls, arguments=piece)))
        if not arguments.is_done:
            return False
        if not self._num_sent:  # no JSON: the call has no arguments
            deltas += self._close_call()
        self._pending = arguments.text[arguments.end:] if arguments.end is not None else arguments.text
        self._num_calls += 1
        self._state = _State.AFTER_CALL
        return True

    def _close_call(self) -> list[MessageDelta]:
        return [MessageDelta(tool_call=ToolCallDelta(self._num_calls, arguments="{}"))]

    def _read_after_call(self) -> bool:
        _, end, after = split_at_any(self._pending, ENDS)
        if end is None:
            self._pending = after
            return False
        self._next_message(end, after)
        return True


def new_parser(tools: tuple[Tool, ...]) -> HarmonyParser:
    return HarmonyParser(parses_calls=True)


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    """After `to=functions.NAME`, the rest of the header and the tool's JSON arguments. The message's end
    (`<|call|>`, a stop token) is left to the model: a grammar may not spell a stop token as text."""
    header = {"type": "regex", "pattern": r"(<\|channel\|>commentary)?( ?<\|constrain\|>json| json)? ?"}
    tags = [tag(f"{TRIGGER}{tool.name}", {"type": "sequence", "elements": [
        header, {"type": "const_string", "value": "<|message|>"}, json_arguments(tool)]}, "") for tool in tools]
    return triggered([TRIGGER], tags, parallel)
