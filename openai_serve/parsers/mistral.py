"""`mistral`: Mistral's models write calls after `[TOOL_CALLS]`, in one of two forms: the newer
`[TOOL_CALLS]NAME[ARGS]{...}` (one `[TOOL_CALLS]` per call; Mistral Small 3.2 may put
`[CALL_ID]ID` before `[ARGS]`), and the older `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
(Mistral 7B v0.3, Nemo). This parser reads both. Call ids are 9 letters and digits, as Mistral's
chat templates require of the ids sent back to them (they refuse any other).
"""

import secrets
import string

import regex

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.json_calls import CallStream
from openai_serve.parsers.json_spans import JsonSpans
from openai_serve.parsers.marked_calls import MarkedCallsParser, MarkedSyntax
from openai_serve.parsers.tool_call_grammar import Format, json_arguments, tag, triggered
from openai_serve.protocol.tools import Tool, forced_schema_of_calls

TRIGGER = "[TOOL_CALLS]"
_ID_CHARACTERS = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "".join(secrets.choice(_ID_CHARACTERS) for _ in range(9))


SYNTAX = MarkedSyntax(
    # The model's own [CALL_ID] is the call's id where it has the shape the templates take back.
    head=regex.compile(regex.escape(TRIGGER) + r"\s*(?P<name>[^\[\]{}\s]+)\s*"
                       r"(?:\[CALL_ID\](?:(?P<id>[A-Za-z0-9]{9})|[^\[\]]*))?\[ARGS\]"),
    tail=regex.compile(""),
    call_begin=TRIGGER,
    closing=None,
    new_id=new_call_id,
)


class MistralToolParser(MarkedCallsParser):
    def __init__(self) -> None:
        super().__init__(SYNTAX)
        self._array: JsonSpans | None = None  # the older form's array of calls, while it is read
        self._array_calls: list[CallStream] = []

    def finish(self) -> list[MessageDelta]:
        if self._array is not None and not any(call.is_started for call in self._array_calls):
            self._pending = ""
            return [MessageDelta(content=self._opening() + TRIGGER + self._array.text)]  # never became a call
        return [] if self._array is not None else super().finish()

    def _read_head(self, deltas: list[MessageDelta]) -> bool:
        if self._array is not None:
            return self._read_array(deltas)
        rest = self._pending[len(TRIGGER):]
        if not rest.strip():
            return False
        if not rest.lstrip().startswith("["):
            return super()._read_head(deltas)
        self._array, self._pending = JsonSpans(max_depth=2), rest
        return self._read_array(deltas)

    def _read_array(self, deltas: list[MessageDelta]) -> bool:
        array = self._array
        assert array is not None
        array.feed(self._take_pending())
        while (len(self._array_calls),) in array.spans:
            index = len(self._array_calls)
            self._array_calls.append(CallStream(self._num_calls + index, array, (index,), new_call_id))
        deltas += [delta for call in self._array_calls for delta in call.update()]
        if not array.is_done:
            return False
        started = sum(call.is_started for call in self._array_calls)
        self._num_calls += started
        self._array, self._array_calls = None, []
        if not started:  # not calls after all: the tag is content, the rest is read again
            deltas.append(MessageDelta(content=self._opening() + TRIGGER))
            self._read_on(array.text)
        else:
            self._read_on(array.text[array.position if array.is_invalid else array.end:])  # type: ignore[misc]
        return True


def new_parser(tools: tuple[Tool, ...]) -> MistralToolParser:
    return MistralToolParser()


def call_grammar(tools: tuple[Tool, ...], parallel: bool) -> Format:
    """Either form: each tool's `[TOOL_CALLS]NAME[ARGS]{...}`, or the older array of calls."""
    tags = [tag(f"{TRIGGER}{tool.name}[ARGS]", json_arguments(tool), "") for tool in tools]
    array = {"type": "json_schema", "json_schema": forced_schema_of_calls(tools, parallel, "arguments")}
    return triggered([TRIGGER], [*tags, tag(TRIGGER, array, "")], parallel)
