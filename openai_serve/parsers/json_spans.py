"""Where the values of a JSON text lie while the model is still writing it.

`JsonSpans` is fed a JSON text piece by piece and records the raw span of every value down to
`max_depth` (the top-level value has path `()`, a member of it `("name",)`, an element `(0,)` ...).
Tool-call parsers stream a call's `arguments` as raw slices of the model's own text, so the pieces a
client concatenates are exactly the text a non-streamed answer carries (no re-serialisation, no
diffing of partial parses). Each character is looked at once; string bodies and runs of whitespace
are skipped by regular expressions. Text after the top-level value is left alone (`end` says where
the value ended), since what follows is the caller's: a closing tag, a `;`, prose.
"""

import json
import re
from dataclasses import dataclass, field
from enum import Enum

Path = tuple[str | int, ...]

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_STRING_BODY = re.compile(r'[^"\\]*')
_SCALAR_BODY = re.compile(r"[^ \t\n\r,\]}]*")
_SCALAR_START = frozenset("-0123456789tfn")


@dataclass
class Span:
    start: int
    end: int | None = None  # exclusive; None while the value is still open


class _Expect(Enum):
    VALUE = "value"
    VALUE_OR_CLOSE = "value or ]"
    KEY = "key"
    KEY_OR_CLOSE = "key or }"
    COLON = ":"
    COMMA_OR_CLOSE = ", or close"


@dataclass
class _Container:
    path: Path
    is_object: bool
    expect: _Expect
    key: str | None = None  # the member being read (objects)
    index: int = -1  # the element being read (arrays)

    def child_path(self) -> Path:
        return (*self.path, self.key if self.is_object else self.index)  # type: ignore[return-value]


@dataclass
class JsonSpans:
    max_depth: int = 1
    text: str = ""
    spans: dict[Path, Span] = field(default_factory=dict)
    end: int | None = None  # offset just past the top-level value, once it is complete
    is_invalid: bool = False  # the text is not JSON
    _pos: int = 0
    _stack: list[_Container] = field(default_factory=list)
    _string: tuple[int, bool] | None = None  # (start, is_key) of the string being read
    _scalar: tuple[int, Path] | None = None  # (start, path) of the number or literal being read

    @property
    def position(self) -> int:
        """How far the text is read: once it is invalid, where it broke."""
        return self._pos

    @property
    def is_done(self) -> bool:
        return self.end is not None or self.is_invalid

    def feed(self, piece: str) -> None:
        self.text += piece
        while not self.is_done and self._pos < len(self.text) and self._step():
            pass

    def complete(self, path: Path) -> str | None:
        """The raw text of the value at `path` once it is complete, else None."""
        span = self.spans.get(path)
        return None if span is None or span.end is None else self.text[span.start:span.end]

    def _step(self) -> bool:
        """Consumes what it can at the cursor; False when it must wait for more text."""
        if self._string is not None:
            return self._read_string()
        if self._scalar is not None:
            return self._read_scalar()
        self._pos = _WHITESPACE.match(self.text, self._pos).end()  # type: ignore[union-attr]
        if self._pos == len(self.text):
            return False
        expect = self._stack[-1].expect if self._stack else _Expect.VALUE
        self._read_token(self.text[self._pos], expect)
        return True

    def _read_token(self, char: str, expect: _Expect) -> None:
        container = self._stack[-1] if self._stack else None
        if expect in (_Expect.KEY_OR_CLOSE, _Expect.VALUE_OR_CLOSE) and char in "}]":
            self._close(char)
        elif expect in (_Expect.KEY, _Expect.KEY_OR_CLOSE) and char == '"':
            self._string = (self._pos, True)
            self._pos += 1
        elif expect is _Expect.COLON and char == ":":
            container.expect = _Expect.VALUE  # type: ignore[union-attr]
            self._pos += 1
        elif expect is _Expect.COMMA_OR_CLOSE and char == ",":
            container.expect = _Expect.KEY if container.is_object else _Expect.VALUE  # type: ignore[union-attr]
            self._pos += 1
        elif expect is _Expect.COMMA_OR_CLOSE and char in "}]":
            self._close(char)
        elif expect in (_Expect.VALUE, _Expect.VALUE_OR_CLOSE):
            self._open_value(char, container)
        else:
            self.is_invalid = True

    def _open_value(self, char: str, container: _Container | None) -> None:
        if container is not None and not container.is_object:
            container.index += 1
        path = () if container is None else container.child_path()
        if char in "{[":
            self._record_start(path)
            expect = _Expect.KEY_OR_CLOSE if char == "{" else _Expect.VALUE_OR_CLOSE
            self._stack.append(_Container(path, char == "{", expect))
            self._pos += 1
        elif char == '"':
            self._record_start(path)
            self._string = (self._pos, False)
            self._pos += 1
        elif char in _SCALAR_START:
            self._record_start(path)
            self._scalar = (self._pos, path)
        else:
            self.is_invalid = True

    def _read_string(self) -> bool:
        self._pos = _STRING_BODY.match(self.text, self._pos).end()  # type: ignore[union-attr]
        if self._pos == len(self.text):
            return False
        if self.text[self._pos] == "\\":
            if self._pos + 1 == len(self.text):
                return False  # the escaped character has not arrived
            self._pos += 2
            return True
        self._pos += 1  # the closing quote
        start, is_key = self._string  # type: ignore[misc]
        self._string = None
        if is_key:
            container = self._stack[-1]
            try:
                container.key = json.loads(self.text[start:self._pos])
            except json.JSONDecodeError:  # a raw control character or a bad escape in it: not JSON
                self.is_invalid = True
                return False
            container.expect = _Expect.COLON
        else:
            self._value_ended(self._path_of_value())
        return True

    def _read_scalar(self) -> bool:
        self._pos = _SCALAR_BODY.match(self.text, self._pos).end()  # type: ignore[union-attr]
        if self._pos == len(self.text):
            return False  # a number may go on (a literal at the very end completes with the next piece)
        _, path = self._scalar  # type: ignore[misc]
        self._scalar = None
        self._value_ended(path)
        return True

    def _close(self, char: str) -> None:
        container = self._stack.pop()
        if char != ("}" if container.is_object else "]"):
            self.is_invalid = True
            return
        self._pos += 1
        self._value_ended(container.path)

    def _path_of_value(self) -> Path:
        return () if not self._stack else self._stack[-1].child_path()

    def _record_start(self, path: Path) -> None:
        if len(path) <= self.max_depth:
            self.spans[path] = Span(self._pos)

    def _value_ended(self, path: Path) -> None:
        if path in self.spans:
            self.spans[path].end = self._pos
        if self._stack:
            self._stack[-1].expect = _Expect.COMMA_OR_CLOSE
        else:
            self.end = self._pos
