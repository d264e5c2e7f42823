"""`hermes`: Hermes 2 Pro, Qwen2.5, Qwen3 and others write each call as
`<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, possibly after some text.

Text before the first call is content. Whitespace around and between calls is dropped (it is held
until text follows it, so a stream and a response in full agree). A `<tool_call>` whose body is not
a JSON object with a name is content, as written.
"""

import json
from enum import Enum

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.json_calls import JsonCallsParser
from openai_serve.parsers.tags import held_back
from openai_serve.parsers.tool_call_grammar import Format, json_arguments, tag, triggered
from openai_serve.protocol.tools import Tool

START = "<tool_call>"
END = "</tool_call>"


class _State(Enum):
    CONTENT = "content"
    CALL = "call"  # inside <tool_call>, reading the JSON
    CLOSING = "closing"  # after the call's JSON, expecting </tool_call>
    SKIPPING = "skipping"  # a call that broke off: up to </tool_call> is dropped


class HermesToolParser(JsonCallsParser):
    def __init__(self) -> None:
        super().__init__()
        self._state = _State.CONTENT
        self._space = ""  # the whitespace before the call's tag
    def finish(self) -> list[MessageDelta]:
        pending = self._take_pending()
        if self._state is _State.CONTENT and (pending.strip() or not self._num_calls):
            return [MessageDelta(content=pending)] if pending else []
        if self._state is _State.CALL and not self._call.is_started:
            return [MessageDelta(content=self._space + START + self._call.spans.text)]
        return []

    def _step(self, deltas: list[MessageDelta]) -> bool:
        if self._state is _State.CONTENT:
            return self._read_content(deltas)
        if self._state is _State.CALL:
            return self._read_call(deltas)
        return self._read_closing()

    def _read_content(self, deltas: list[MessageDelta]) -> bool:
        found = self._send_content_before((START,), deltas)
        if found is None:
            return False
        self._space, _, self._pending = found  # the whitespace is content again if what follows is not a call
        self._start_call()
        return True

    def _start_call(self) -> None:
        self._state = _State.CALL
        super()._start_call()

    def _read_call(self, deltas: list[MessageDelta]) -> bool:
        spans, call = self._feed_call(deltas), self._call
        if spans.is_invalid:
            if not call.is_started:
                return self._not_a_call(deltas, spans.position)
            self._state = _State.SKIPPING
            self._pending = spans.text
            return True
        if spans.end is None:
            return False
        if not call.is_started:  # a JSON value without a name: not a call
            return self._not_a_call(deltas, spans.end)
        self._num_calls += 1
        self._pending = spans.text[spans.end:]
        self._state = _State.CLOSING
        return True

    def _not_a_call(self, deltas: list[MessageDelta], end: int) -> bool:
        """The tag and the text read as JSON up to `end` are content; what follows is read again."""
        text = self._call.spans.text
        deltas.append(MessageDelta(content=self._space + START + text[:end]))
        self._pending, self._state = text[end:], _State.CONTENT
        return True

    def _read_closing(self) -> bool:
        if self._state is _State.SKIPPING:
            _, tag, after = self._pending.partition(END)
            if not tag:
                self._pending = self._pending[len(self._pending) - held_back(self._pending, END):]
                return False
            self._pending, self._state = after, _State.CONTENT
            return True
        rest = self._pending.lstrip()
        if rest.startswith(END):
            self._pending, self._state = rest[len(END):], _State.CONTENT
            return True
        if END.startswith(rest):  # nothing yet, or part of the tag
            self._pending = rest
            return False
        self._pending, self._state = rest, _State.CONTENT  # no closing tag: lenient
        return True


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    """After `<tool_call>`, one of the tools' names and its arguments, in the layout the templates teach."""
    tags = [tag(f'{START}\n{{"name": {json.dumps(tool.name)}, "arguments": ', json_arguments(tool), f"}}\n{END}")
            for tool in tools]
    return triggered([START], tags, parallel)
