"""Arguments written as text, one value per parameter (Qwen3-Coder's `<parameter=k>`, GLM's `<arg_value>`),
made into a JSON object by the tool's own schema: a string parameter keeps the model's text as it is;
a number, boolean, null, object or array parameter is read as JSON (a model writes `3`, `true`,
`{"a": 1}`); a value that does not read as its type stays a string, so nothing the model wrote is lost.
A parameter the schema does not list, or lists without a type, is a string (as vLLM reads them).
"""

import json

from openai_serve.parsers.deltas import MessageDelta, ToolCallDelta, new_tool_call_id
from openai_serve.protocol.tools import Tool

Schema = dict[str, object]


def parameter_schemas(tools: tuple[Tool, ...]) -> dict[str, dict[str, Schema]]:
    """For each tool by name: its parameters' schemas by parameter name."""
    schemas = {}
    for tool in tools:
        properties = tool.parameters.get("properties")
        schemas[tool.name] = properties if isinstance(properties, dict) else {}
    return schemas


class ArgumentsWriter:
    """One call's deltas: its id and name, then its arguments as JSON one parameter at a time (`{"k": v`,
    `, "k2": v2`), then `}` (`{}` for none)."""

    def __init__(self, index: int, name: str, schemas: dict[str, Schema]) -> None:
        self._index = index
        self._name = name
        self._schemas = schemas  # the tool's parameters' schemas by name (empty for a tool the request lacks)
        self._num_arguments = 0

    def start(self) -> MessageDelta:
        return MessageDelta(tool_call=ToolCallDelta(self._index, new_tool_call_id(), self._name))

    def add(self, key: str, text: str) -> MessageDelta:
        value = typed_value(text, self._schemas.get(key))
        opening = "{" if not self._num_arguments else ", "
        self._num_arguments += 1
        piece = f"{opening}{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
        return MessageDelta(tool_call=ToolCallDelta(self._index, arguments=piece))

    def close(self) -> MessageDelta:
        return MessageDelta(tool_call=ToolCallDelta(self._index, arguments="}" if self._num_arguments else "{}"))


def typed_value(text: str, schema: Schema | None) -> object:
    """The value a parameter's text stands for, by its schema."""
    types = _types(schema)
    if not types or "string" in types:
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        lowered = text.strip().lower()  # Python's spellings, which models trained on code write
        value = {"true": True, "false": False, "none": None}.get(lowered, text)
    return value if _fits(value, types) else text


def _types(schema: Schema | None) -> set[str]:
    if schema is None:
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    found: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:  # type: ignore[union-attr]
            found |= _types(option) if isinstance(option, dict) else set()
    return found


_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,), "array": (list,),
    "null": (type(None),),
}


def _fits(value: object, types: set[str]) -> bool:
    """Whether a value read as JSON is of one of the types."""
    if isinstance(value, bool):  # a bool is an int to Python, never a number to JSON Schema
        return "boolean" in types
    return any(isinstance(value, _PYTHON_TYPES.get(kind, ())) for kind in types)
