"""Anthropic's `tools` and `tool_choice`, read into chat's `ToolRequest` (tools.py), so a tool is
prompted, forced and parsed as on chat completions.

A tool is `{"name", "description", "input_schema"}` (`type` absent or `custom`); it reaches the chat
template as the function `{"name", "description", "parameters": input_schema}`. Anthropic's own tool
types (`bash_...`, `web_search_...`, `text_editor_...`) have schemas only Anthropic knows, or run on
its servers: a 400. What a tool carries for Anthropic's API alone (`cache_control`, `defer_loading`,
`strict`, `eager_input_streaming`, `allowed_callers`, `input_examples`) is accepted.

`tool_choice`: `auto` (the default with tools), `any` (chat's `required`), `tool` with a `name`
(chat's named function), `none`; `disable_parallel_tool_use` is chat's `parallel_tool_calls: false`.
`any` and `tool` are enforced with structured output, as chat's `required` and named choices are.
"""

from openai_serve.errors import bad_request, unsupported
from openai_serve.protocol.fields import Fields
from openai_serve.protocol.tools import Tool, ToolChoice, ToolRequest, read_tool_list

_CHOICES = {"auto": ToolChoice.AUTO, "any": ToolChoice.REQUIRED, "tool": ToolChoice.NAMED, "none": ToolChoice.NONE}


def read_anthropic_tools(fields: Fields) -> ToolRequest:
    tools = read_tool_list(fields.raw("tools"), _read_tool)
    choice = fields.get_object("tool_choice")
    if choice is None:
        return ToolRequest(tools, ToolChoice.AUTO if tools else ToolChoice.NONE)
    return _read_choice(choice, tools)


def _read_tool(value: object, name: str) -> Tool:
    fields = Fields(value, name + ".")
    kind = fields.get_str("type", None)
    if kind not in (None, "custom"):
        raise unsupported(fields.name("type"), f"must be 'custom' (got {kind!r}): Anthropic's own tools are not "
                          "supported; define the tool by its input_schema")
    tool_name = fields.get_str("name", None)
    if not tool_name:
        raise bad_request(f"'{fields.name('name')}' must be a non-empty string", fields.name("name"))
    schema = fields.raw("input_schema")
    if not isinstance(schema, dict):
        raise bad_request(f"'{fields.name('input_schema')}' must be a JSON Schema object", fields.name("input_schema"))
    function = {"name": tool_name, "description": fields.get_str("description", ""), "parameters": schema}
    return Tool(tool_name, {"type": "function", "function": function})


def _read_choice(choice: Fields, tools: tuple[Tool, ...]) -> ToolRequest:
    kind = choice.get_str("type", None)
    if kind not in _CHOICES:
        name = choice.name("type")
        raise bad_request(f"'{name}' must be one of {', '.join(_CHOICES)}, got {kind!r}", name)
    is_parallel = not choice.get_bool("disable_parallel_tool_use", False)
    tool_choice = _CHOICES[kind]
    named = choice.get_str("name", None) if tool_choice is ToolChoice.NAMED else None
    choice.check_unknown()
    if tool_choice in (ToolChoice.REQUIRED, ToolChoice.NAMED) and not tools:
        raise bad_request(f"'tool_choice' {kind!r} needs 'tools'", "tool_choice")
    if tool_choice is ToolChoice.NAMED and named not in {tool.name for tool in tools}:
        raise bad_request(f"'tool_choice.name' must name one of 'tools', got {named!r}", "tool_choice.name")
    if not tools:
        tool_choice = ToolChoice.NONE
    return ToolRequest(tools, tool_choice, named, is_parallel)
