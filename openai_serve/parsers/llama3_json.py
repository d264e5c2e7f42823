"""`llama3_json`: Llama 3.1-3.3 (and 4) write calls as JSON: `{"name": "f", "parameters": {...}}`,
several separated by `;`, sometimes after `<|python_tag|>`.

Whether an answer is calls or prose is decided by how it starts (after whitespace): with `{` or the
tag it is calls, otherwise all of it is content (as vLLM's streaming parser decides). Text after
the last call is content. A call that is not a JSON object with a name is content, as written.
"""

import json
from enum import Enum

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.json_calls import JsonCallsParser
from openai_serve.parsers.tool_call_grammar import Format, json_arguments
from openai_serve.protocol.tools import Tool

PYTHON_TAG = "<|python_tag|>"


class _State(Enum):
    START = "start"  # nothing but whitespace (or part of the tag) so far
    CONTENT = "content"
    CALL = "call"
    BETWEEN = "between"  # after a call: `;` and the next, or content


class Llama3JsonToolParser(JsonCallsParser):
    def __init__(self) -> None:
        super().__init__()
        self._state = _State.START
        self._after_separator = False

    def finish(self) -> list[MessageDelta]:
        pending = self._take_pending()
        if self._state is _State.CALL and not self._call.is_started:
            return [MessageDelta(content=self._call.spans.text)]
        if self._state in (_State.START, _State.CONTENT) and pending:
            return [MessageDelta(content=pending)]
        return []

    def _step(self, deltas: list[MessageDelta]) -> bool:
        if self._state is _State.START:
            return self._read_start()
        if self._state is _State.CONTENT:
            return self._send_content(deltas)
        if self._state is _State.CALL:
            return self._read_call(deltas)
        return self._read_between()

    def _read_start(self) -> bool:
        rest = self._pending.lstrip()
        if rest.startswith(PYTHON_TAG):
            self._pending = rest[len(PYTHON_TAG):]
            self._state, self._after_separator = _State.BETWEEN, True
            return True
        if not rest or PYTHON_TAG.startswith(rest):
            return False
        if rest.startswith("{"):
            self._pending = rest
            self._start_call()
        else:
            self._state = _State.CONTENT
        return True

    def _start_call(self) -> None:
        self._state = _State.CALL
        super()._start_call()

    def _read_call(self, deltas: list[MessageDelta]) -> bool:
        spans, call = self._feed_call(deltas), self._call
        if not spans.is_done:
            return False
        if not call.is_started:  # not a call after all
            self._pending, self._state = spans.text, _State.CONTENT
            return True
        self._num_calls += 1
        self._pending = spans.text[spans.position:] if spans.is_invalid else spans.text[spans.end:]  # where it broke
        self._state, self._after_separator = _State.BETWEEN, False
        return True

    def _read_between(self) -> bool:
        rest = self._pending.lstrip()
        if not rest:
            self._pending = ""
            return False
        if rest.startswith("{") and (self._after_separator or not self._num_calls):
            self._pending = rest
            self._start_call()
        elif rest.startswith(";") and not self._after_separator:
            self._pending, self._after_separator = rest[1:], True
        else:
            self._pending, self._state = rest, _State.CONTENT
        return True


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    """Calls only where this parser reads them, at the answer's start (after the tag, if any): either calls
    of the tools, `;`-separated, or prose in which no call starts (`{"name"` does not occur in it)."""
    calls = [{"type": "tag", "begin": f'{{"name": {json.dumps(tool.name)}, "parameters": ',
              "content": json_arguments(tool), "end": "}"} for tool in tools]
    in_a_row = {"type": "tags_with_separator", "tags": calls, "separator": "; ", "at_least_one": True,
                "stop_after_first": not parallel}
    opening = {"type": "regex", "pattern": r"\s*(<\|python_tag\|>)?"}
    return {"type": "or", "elements": [{"type": "sequence", "elements": [opening, in_a_row]},
                                       {"type": "any_text", "excludes": ['{"name"']}]}
