"""Tool calls marked by tags around a name and JSON arguments, as DeepSeek V3 / V3.1
(`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...`), Kimi K2
(`<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}
<|tool_call_end|>...`) and Mistral (`[TOOL_CALLS]NAME[ARGS]{...}`) write them. `MarkedSyntax` says how
a family writes them; `MarkedCallsParser` reads them.

A call's id and name go out once its head (the tags and name before the arguments) is complete and
its arguments open a JSON object; its arguments then go out as the model writes them, raw slices of
its text, so the pieces concatenate to exactly what a response in full carries. A head that cannot
become one (or arguments that are not an object) is not a call: its tags are content, as written,
and what follows is read again. Arguments whose JSON breaks off are dropped up to the call's end.
Text before calls is content (trailing whitespace dropped), and whitespace between calls is dropped.
"""

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import regex

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta, new_tool_call_id
from openai_serve.parsers.json_spans import JsonSpans
from openai_serve.parsers.partial_match import MAX_HEAD_CHARS, Found, find
from openai_serve.parsers.stepping import SteppingParser
from openai_serve.parsers.tags import held_back


@dataclass(frozen=True)
class MarkedSyntax:
    head: regex.Pattern[str]  # a call's tags and name, up to its arguments: the name in group "name"
    tail: regex.Pattern[str]  # after the arguments, up to the call's end
    call_begin: str  # what starts a call
    closing: str | None  # what a call whose arguments broke off is dropped up to (None: nothing is dropped)
    section: tuple[str, str] | None = None  # the tags around a message's calls, where the family has them
    new_id: Callable[[], str] = new_tool_call_id


def sectioned_syntax(section: tuple[str, str], call: tuple[str, str], head: str, tail: str = r"\s*") -> MarkedSyntax:
    """Calls written `call[0] HEAD {...} TAIL call[1]`, one after another inside `section[0] ... section[1]`;
    `head` is a pattern with the name in group "name", `tail` one of what may stand before the call's end."""
    begin, end = call
    return MarkedSyntax(head=regex.compile(regex.escape(begin) + head), tail=regex.compile(tail + regex.escape(end)),
                        call_begin=begin, closing=end, section=section)


class _State(Enum):
    CONTENT = "content"
    SECTION = "section"  # inside a section, between calls
    HEAD = "head"  # a call's head
    ARGUMENTS = "arguments"
    TAIL = "tail"
    SKIPPING = "skipping"  # a call whose arguments broke off


class MarkedCallsParser(SteppingParser):
    def __init__(self, syntax: MarkedSyntax) -> None:
        super().__init__()
        self._syntax = syntax
        self._state = _State.CONTENT
        self._num_calls = 0  # calls whose id and name went out
        self._section_start = 0  # `_num_calls` when the section opened
        self._space = ""  # whitespace before the tags that opened the calls: content if they are not calls
        self._head = ""  # the call's head, as written
        self._name = ""
        self._call_id: str | None = None  # the id the model wrote, where its format has one
        self._spans = JsonSpans(max_depth=0)  # the call's arguments and what follows them
        self._num_sent = 0  # characters of the call's arguments sent

    def finish(self) -> list[MessageDelta]:
        pending, state = self._take_pending(), self._state
        if state is _State.CONTENT:
            return [MessageDelta(content=pending)] if pending.strip() or (pending and not self._num_calls) else []
        opened = self._opening()
        if state is _State.SECTION and self._num_calls == self._section_start:
            return [MessageDelta(content=opened + pending)]  # a section with no call in it
        if state is _State.HEAD:  # never became a call
            return [MessageDelta(content=opened + pending)]
        if state is _State.ARGUMENTS and not self._num_sent:
            return [MessageDelta(content=opened + self._head + self._spans.text)]
        return []

    def _opening(self) -> str:
        """What came before a call's text and is content if it is not one: the whitespace before its tag,
        and the section's tag if it is the section's first."""
        section = self._syntax.section
        if section is None:
            return self._space
        return self._space + section[0] if self._num_calls == self._section_start else ""

    def _step(self, deltas: list[MessageDelta]) -> bool:
        state = self._state
        if state is _State.CONTENT:
            return self._read_content(deltas)
        if state is _State.SECTION:
            return self._read_section(deltas)
        if state is _State.HEAD:
            return self._read_head(deltas)
        if state is _State.ARGUMENTS:
            return self._read_arguments(deltas)
        if state is _State.TAIL:
            return self._read_tail()
        return self._skip()

    def _read_content(self, deltas: list[MessageDelta]) -> bool:
        section = self._syntax.section
        begin = section[0] if section else self._syntax.call_begin
        found = self._send_content_before((begin,), deltas)
        if found is None:
            return False
        self._space, tag, after = found
        if section:
            self._pending, self._state, self._section_start = after, _State.SECTION, self._num_calls
        else:
            self._pending, self._state = tag + after, _State.HEAD
        return True

    def _read_section(self, deltas: list[MessageDelta]) -> bool:
        rest, end = self._pending.lstrip(), self._syntax.section[1]  # type: ignore[index]
        if rest.startswith(end):
            self._pending, self._state = rest[len(end):], _State.CONTENT
            return True
        if rest.startswith(self._syntax.call_begin):
            self._pending, self._state = rest, _State.HEAD
            return True
        if end.startswith(rest) or self._syntax.call_begin.startswith(rest):
            return False  # its whitespace is kept: content, should the section hold no call
        if self._num_calls == self._section_start:  # a section with no call in it: its tag is content
            deltas.append(MessageDelta(content=self._opening()))
            rest = self._pending
        self._pending, self._state = rest, _State.CONTENT
        return True

    def _read_head(self, deltas: list[MessageDelta]) -> bool:
        found = find(self._pending, 0, self._syntax.head, limit=MAX_HEAD_CHARS)
        if found is Found.WAIT:
            return False
        if found is Found.NONE:
            return self._not_a_call(deltas)
        self._name, self._call_id = found["name"].strip(), found.groupdict().get("id")  # type: ignore[union-attr]
        self._head, self._pending = self._pending[:found.end()], self._pending[found.end():]  # type: ignore[union-attr]
        self._spans, self._num_sent = JsonSpans(max_depth=0), 0
        self._state = _State.ARGUMENTS
        return True

    def _not_a_call(self, deltas: list[MessageDelta], text: str | None = None) -> bool:
        """The call's first tag is content; what follows it is read again."""
        text = self._pending if text is None else text
        begin = self._syntax.call_begin
        deltas.append(MessageDelta(content=self._opening() + begin))
        self._pending, self._state = text[len(begin):], _State.CONTENT
        return True

    def _read_arguments(self, deltas: list[MessageDelta]) -> bool:
        spans = self._spans
        spans.feed(self._take_pending())
        span = spans.spans.get(())
        if span is None and not spans.is_invalid:
            return False  # nothing but whitespace yet
        if not self._num_sent and (span is None or spans.text[span.start] != "{"):  # arguments must be an object
            return self._not_a_call(deltas, self._head + spans.text)
        if not self._num_sent:
            call_id = self._call_id or self._syntax.new_id()
            deltas.append(MessageDelta(tool_call=ToolCallDelta(self._num_calls, call_id, self._name)))
        return self._send_arguments(deltas)

    def _send_arguments(self, deltas: list[MessageDelta]) -> bool:
        spans = self._spans
        start = spans.spans[()].start
        end = spans.position if spans.is_invalid else len(spans.text) if spans.end is None else spans.end
        piece = spans.text[start + self._num_sent:end]
        self._num_sent = max(self._num_sent, end - start)
        if piece:
            deltas.append(MessageDelta(tool_call=ToolCallDelta(self._num_calls, arguments=piece)))
        if spans.is_invalid:  # broke off: what went out is its arguments, the rest is dropped up to the call's end
            self._end_call(spans.text[end:], _State.SKIPPING)
            return True
        if spans.end is None:
            return False
        self._end_call(spans.text[spans.end:], _State.TAIL)
        return True

    def _read_on(self, rest: str) -> None:
        """After calls: the rest is read as what is between calls (in a section) or content."""
        self._pending, self._state = rest, _State.SECTION if self._syntax.section else _State.CONTENT

    def _end_call(self, rest: str, state: _State) -> None:
        self._num_calls += 1
        self._pending, self._state = rest, state

    def _read_tail(self) -> bool:
        found = find(self._pending, 0, self._syntax.tail)
        if found is Found.WAIT:
            return False
        self._read_on(self._pending[found.end():] if isinstance(found, regex.Match) else self._pending)  # lenient
        return True

    def _skip(self) -> bool:
        closing = self._syntax.closing
        if closing is None:
            self._state = _State.CONTENT
            return True
        _, tag, after = self._pending.partition(closing)
        if not tag:
            self._pending = self._pending[len(self._pending) - held_back(self._pending, closing):]
            return False
        self._read_on(after)
        return True
