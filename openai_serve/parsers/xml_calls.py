"""Tool calls whose arguments are written one parameter at a time in tags, as Qwen3-Coder / Qwen3.5
(`<function=f><parameter=k>v</parameter></function>`) and GLM-4.5+ (`<arg_key>k</arg_key><arg_value>v
</arg_value>`) write them. `XmlSyntax` says how a family writes one call; `XmlCallsParser` reads them.

A call's arguments go out as JSON, one parameter as soon as its closing tag is in (`{"k": v`, then
`, "k2": v2`, then `}`), each value typed by the tool's schema (typed_values.py). Its id and name go out
once the call's structure shows (`head` matches: the name is complete and a parameter or the call's
end follows), so a tag around something that is not a call is content, as written. A call cut off
after that (max_tokens) keeps the parameters that were complete; one that breaks off is dropped up to
its closing tag. Text before a call is content, its trailing whitespace dropped; whitespace between
and after calls too.
"""

from dataclasses import dataclass
from enum import Enum

import regex

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.partial_match import MAX_HEAD_CHARS, Found, find
from openai_serve.parsers.stepping import SteppingParser
from openai_serve.parsers.tags import held_back
from openai_serve.parsers.typed_values import ArgumentsWriter, parameter_schemas
from openai_serve.protocol.tools import Tool


@dataclass(frozen=True)
class XmlSyntax:
    begins: tuple[str, ...]  # what opens a call in content (the start of the call's text)
    head: regex.Pattern[str]  # from the call's start to its first parameter: the name in group "name"
    parameter: regex.Pattern[str]  # one parameter: groups "key" and "value"
    parameter_opening: str  # how a parameter starts
    value_end: str  # the tag that ends a parameter's value (its text is searched for it, not matched, until then)
    end: regex.Pattern[str]  # the call's end
    closing: str  # the tag a call that broke off is dropped up to (its trailer, if any, is read after it)
    trailer: str | None = None  # an optional closing tag after the end (`</tool_call>` after `</function>`)
    strip_newline: bool = False  # a value's one leading and one trailing newline are layout, not value


class _State(Enum):
    CONTENT = "content"
    CALL = "call"  # reading a call's text
    TRAILER = "trailer"  # after a call's end: its optional closing tag
    SKIPPING = "skipping"  # a call that broke off: dropped up to its closing tag


class XmlCallsParser(SteppingParser):
    def __init__(self, syntax: XmlSyntax, tools: tuple[Tool, ...]) -> None:
        super().__init__()
        self._syntax = syntax
        self._schemas = parameter_schemas(tools)
        self._state = _State.CONTENT
        self._num_calls = 0
        self._call: ArgumentsWriter | None = None
        self._position = 0  # how far the call's text (in `_pending`) is read
        self._space = ""  # the whitespace before the call's tag
        self._searched = 0  # how far the pending text is known not to hold the end of a value

    def finish(self) -> list[MessageDelta]:
        pending, call = self._take_pending(), self._call
        if self._state is _State.CONTENT:
            return [MessageDelta(content=pending)] if pending.strip() or (pending and not self._num_calls) else []
        if self._state is _State.CALL:
            return [MessageDelta(content=self._space + pending)] if call is None else [call.close()]  # None: not a call
        return []

    def _step(self, deltas: list[MessageDelta]) -> bool:
        if self._state is _State.CONTENT:
            return self._read_content(deltas)
        if self._state is _State.CALL:
            return self._read_head(deltas) if self._call is None else self._read_call(deltas)
        if self._state is _State.TRAILER:
            return self._read_trailer()
        return self._skip()

    def _read_content(self, deltas: list[MessageDelta]) -> bool:
        found = self._send_content_before(self._syntax.begins, deltas)
        if found is None:
            return False
        self._space, tag, after = found  # the whitespace is content again if what the tag opens is not a call
        self._pending, self._position, self._state = tag + after, 0, _State.CALL
        return True

    def _read_head(self, deltas: list[MessageDelta]) -> bool:
        found = find(self._pending, 0, self._syntax.head, limit=MAX_HEAD_CHARS)
        if found is Found.WAIT:
            return False
        if found is Found.NONE:  # not a call after all: its opening tag is content, the rest is read again
            tag = next(tag for tag in self._syntax.begins if self._pending.startswith(tag))
            deltas.append(MessageDelta(content=self._space + tag))
            self._pending, self._state = self._pending[len(tag):], _State.CONTENT
            return True
        name = found["name"].strip()  # type: ignore[index]
        self._call = ArgumentsWriter(self._num_calls, name, self._schemas.get(name, {}))
        deltas.append(self._call.start())
        self._position = found.end()  # type: ignore[union-attr]
        return True

    def _read_call(self, deltas: list[MessageDelta]) -> bool:
        call, syntax = self._call, self._syntax
        assert call is not None
        if self._is_in_a_value():
            return False
        parameter = find(self._pending, self._position, syntax.parameter)
        if isinstance(parameter, regex.Match):
            deltas.append(call.add(parameter["key"].strip(), self._value(parameter["value"])))
            self._position = parameter.end()
            return True
        end = find(self._pending, self._position, syntax.end)
        if isinstance(end, regex.Match):
            deltas.append(call.close())
            self._end_call(self._pending[end.end():], _State.TRAILER if syntax.trailer else _State.CONTENT)
            return True
        if Found.WAIT in (parameter, end):
            return False  # a tag still arriving, or a parameter whose closing tag has not
        deltas.append(call.close())  # broke off: what it had is its arguments
        self._end_call(self._pending[self._position:], _State.SKIPPING)
        return True

    def _is_in_a_value(self) -> bool:
        """A parameter has opened and its value's end is not in yet: matching it would read the whole value
        again at every piece, so the new text is only searched for the end tag."""
        opening, end = self._syntax.parameter_opening, self._syntax.value_end
        if not self._pending[self._position:self._position + MAX_HEAD_CHARS].lstrip().startswith(opening):
            return False
        if self._pending.find(end, max(self._searched, self._position)) >= 0:
            return False
        self._searched = max(self._position, len(self._pending) - len(end) + 1)
        return True

    def _value(self, text: str) -> str:
        if self._syntax.strip_newline:
            text = text.removeprefix("\n").removesuffix("\n")
        return text

    def _end_call(self, rest: str, state: _State) -> None:
        self._pending, self._call, self._state = rest, None, state
        self._num_calls += 1

    def _read_trailer(self) -> bool:
        rest, trailer = self._pending.lstrip(), self._syntax.trailer
        assert trailer is not None
        if trailer.startswith(rest):
            self._pending = rest
            return False
        self._pending = rest[len(trailer):] if rest.startswith(trailer) else rest
        self._state = _State.CONTENT
        return True

    def _skip(self) -> bool:
        closing = self._syntax.closing
        _, tag, after = self._pending.partition(closing)
        if not tag:
            self._pending = self._pending[len(self._pending) - held_back(self._pending, closing):]
            return False
        self._pending, self._state = after, _State.TRAILER if self._syntax.trailer else _State.CONTENT
        return True
