"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request, checked and typed; and of a
Responses API request, whose function tools and named choice are flat (`{"type": "function",
"name": ...}`), read by the same rules into the same values (`read_response_tools`).

Tools reach the chat template as the client sent them (transformers' `apply_chat_template(tools=)`).
`tool_choice` `required` and a named function are enforced with structured output: the answer must
match a JSON Schema built from the tools' own `parameters` (`forced_schema`), so the arguments of
a forced call always validate. `auto` lets the model choose, and the server's tool-call parser
(`--tool-call-parser`) reads its calls; `none` leaves the answer alone. As in OpenAI, the default
is `auto` with tools and `none` without. A function's `strict` is accepted; its arguments are
enforced under `required` and named choices (under `auto` the model may write text, which no
schema can say in advance).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from core import SamplingParams, SamplingParamsError
from core.structured_output import StructuredOutput
from openai_serve.errors import bad_request, refused, unsupported
from openai_serve.protocol.fields import Fields

_ANY_OBJECT: dict[str, object] = {"type": "object"}


class ToolChoice(Enum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"  # {"type": "function", "function": {"name": ...}}


@dataclass(frozen=True)
class Tool:
    name: str
    definition: dict[str, object]  # the client's {"type": "function", "function": {...}}, for the template

    @property
    def parameters(self) -> dict[str, object]:
        function = self.definition["function"]
        parameters = function.get("parameters")  # type: ignore[attr-defined]
        return parameters if parameters else _ANY_OBJECT


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...] = ()
    choice: ToolChoice = ToolChoice.NONE
    named: str | None = None  # the function a named choice forces
    parallel_tool_calls: bool = True

    @property
    def is_forced(self) -> bool:
        return self.choice in (ToolChoice.REQUIRED, ToolChoice.NAMED)

    def template_tools(self) -> list[dict[str, object]] | None:
        return [tool.definition for tool in self.tools] or None


def read_tools(fields: Fields) -> ToolRequest:
    return _read_tool_request(fields, _read_tool, _nested_function)


def read_response_tools(fields: Fields) -> ToolRequest:
    """The Responses API's spelling: a function tool and a named choice carry `name` themselves."""
    return _read_tool_request(fields, _read_response_tool, lambda choice: choice)


def _nested_function(choice: Fields) -> Fields:
    return choice.get_object("function") or Fields({}, choice.name("function") + ".")


def _read_tool_request(
    fields: Fields, read_tool: Callable[[object, str], Tool], function_of: Callable[[Fields], Fields]
) -> ToolRequest:
    """`function_of`: where a named tool_choice holds the function's `name`."""
    tools = read_tool_list(fields.raw("tools"), read_tool)
    choice, named = _read_choice(fields.raw("tool_choice"), tools, function_of)
    return ToolRequest(tools, choice, named, fields.get_bool("parallel_tool_calls", True))


def forced_schema(request: ToolRequest) -> str | None:
    """The JSON Schema (as JSON text) the answer must match; None when nothing is forced.

    As vLLM: a named function's answer is its arguments; `required` answers with an array of calls,
    each `{"name": ..., "parameters": ...}` of one of the tools (one call at most without
    `parallel_tool_calls`)."""
    if request.choice is ToolChoice.NAMED:
        tool = next(t for t in request.tools if t.name == request.named)
        return json.dumps(tool.parameters)
    if request.choice is not ToolChoice.REQUIRED:
        return None
    return json.dumps(forced_schema_of_calls(request.tools, request.parallel_tool_calls, "parameters"))


def forced_schema_of_calls(tools: tuple[Tool, ...], parallel: bool, arguments_key: str) -> dict[str, object]:
    """An array of calls `[{"name": ..., arguments_key: {...}}, ...]` of these tools (one at most unless
    `parallel`): vLLM's shape of a `required` answer, and Mistral's older shape of its calls."""
    calls = [
        {"type": "object", "properties": {"name": {"type": "string", "enum": [tool.name]},
                                          arguments_key: tool.parameters},
         "required": ["name", arguments_key], "additionalProperties": False}
        for tool in tools
    ]
    schema: dict[str, object] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def with_forced_tools(sampling: SamplingParams, request: ToolRequest) -> SamplingParams:
    """The request's SamplingParams, with the structured output a forced tool_choice needs."""
    schema = forced_schema(request)
    if schema is None:
        return sampling
    if sampling.structured_output is not None:
        other = sampling.structured_output.param  # response_format, or the Responses API's text.format
        raise bad_request(f"'tool_choice' required or named cannot be combined with '{other}'", "tool_choice")
    try:
        return replace(sampling, structured_output=StructuredOutput(json_schema=schema, param="tool_choice"))
    except SamplingParamsError as exc:
        raise refused(exc) from exc


def read_tool_list(value: object, read_tool: Callable[[object, str], Tool]) -> tuple[Tool, ...]:
    """`tools`, each read by `read_tool(value, name)`, their names unique."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("'tools' must be an array of tools", "tools")
    tools = tuple(read_tool(tool, f"tools[{i}]") for i, tool in enumerate(value))
    names = [tool.name for tool in tools]
    for name in names:
        if names.count(name) > 1:
            raise bad_request(f"'tools' has two functions named {name!r}", "tools")
    return tools


def _read_tool(value: object, name: str) -> Tool:
    fields = _function_tool_fields(value, name)
    function = fields.get_object("function")
    if function is None:
        raise bad_request(f"'{name}.function' is required", f"{name}.function")
    return Tool(_read_function(function), value)  # type: ignore[arg-type]


def _read_response_tool(value: object, name: str) -> Tool:
    """`{"type": "function", "name", "description", "parameters", "strict"}`, to the template in chat's shape."""
    fields = _function_tool_fields(value, name)
    function = {key: item for key, item in value.items() if key != "type"}  # type: ignore[attr-defined]
    return Tool(_read_function(fields), {"type": "function", "function": function})


def _function_tool_fields(value: object, name: str) -> Fields:
    fields = Fields(value, name + ".")
    kind = fields.get_str("type", None)
    if kind != "function":
        raise unsupported(f"{name}.type", f"must be 'function' (got {kind!r}): only function tools are supported")
    return fields


def _read_function(function: Fields) -> str:
    """The function's name, once its fields are checked (errors name them where the client wrote them)."""
    function_name = function.get_str("name", None)
    if not function_name:
        raise bad_request(f"'{function.name('name')}' must be a non-empty string", function.name("name"))
    function.get_str("description", None)
    function.get_bool("strict", None)
    parameters = function.raw("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        name = function.name("parameters")
        raise bad_request(f"'{name}' must be a JSON Schema object", name)
    return function_name


def _read_choice(
    value: object, tools: tuple[Tool, ...], function_of: Callable[[Fields], Fields]
) -> tuple[ToolChoice, str | None]:
    if value is None:
        return (ToolChoice.AUTO if tools else ToolChoice.NONE), None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise bad_request(f"'tool_choice' must be 'none', 'auto', 'required' or a function, got {value!r}",
                              "tool_choice")
        choice = ToolChoice(value)
        if choice is ToolChoice.REQUIRED and not tools:
            raise bad_request("'tool_choice' 'required' needs 'tools'", "tool_choice")
        return (ToolChoice.NONE if not tools else choice), None
    fields = Fields(value, "tool_choice.")
    if fields.get_str("type", None) != "function":
        raise unsupported("tool_choice.type", "must be 'function' (the other kinds of choice are not supported)")
    function = function_of(fields)
    name = function.get_str("name", None)
    param = function.name("name")
    if name is None:
        raise bad_request(f"'{param}' must name a function", param)
    if name not in {tool.name for tool in tools}:
        raise bad_request(f"'tool_choice' names {name!r}, which is not one of 'tools'", param)
    return ToolChoice.NAMED, name
