"""The request fields that ask for structured output, read into core's `StructuredOutput`.

- OpenAI's `response_format` (and the Responses API's `text.format`, `read_output_format`): `text`
  (nothing), `json_object`, or `json_schema` with its `schema`
  (`strict` accepted either way: the schema is always enforced, in xgrammar's strict mode, where
  properties the schema does not list are never generated).
- vLLM's `structured_outputs`: exactly one of `json` (a schema, as an object or as JSON text),
  `regex`, `choice`, `grammar` (EBNF) or `json_object`; and its older top-level `guided_json`,
  `guided_regex`, `guided_choice`, `guided_grammar`, read the same way rather than ignored.
At most one of these per request. Whether the constraint compiles is the engine's limits' check
(core/request_checks.py), a 400 that gives the grammar engine's reason.
"""

import json
from collections.abc import Callable
from dataclasses import replace

from core import SamplingParams, SamplingParamsError
from core.structured_output import StructuredOutput, StructuredOutputError
from openai_serve.errors import bad_request, refused
from openai_serve.protocol.fields import Fields

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def read_structured_output(fields: Fields) -> StructuredOutput | None:
    found = [c for c in (_response_format(fields), _structured_outputs(fields), *_guided(fields)) if c is not None]
    if len(found) > 1:
        raise bad_request(f"only one structured output may be asked for, got {', '.join(c.param for c in found)}",
                          found[1].param)
    return found[0] if found else None


def with_structured_output(sampling: SamplingParams, structured: StructuredOutput) -> SamplingParams:
    """`sampling` constrained by an API's own output format field (`structured.param`): at most one per request."""
    if sampling.structured_output is not None:
        raise bad_request(f"only one structured output may be asked for, got {structured.param} and "
                          f"{sampling.structured_output.param}", structured.param)
    try:
        return replace(sampling, structured_output=structured)
    except SamplingParamsError as exc:
        raise refused(exc) from exc


def _response_format(fields: Fields) -> StructuredOutput | None:
    spec = fields.get_object("response_format")
    return None if spec is None else read_output_format(spec, "response_format", _nested_schema)


def read_output_format(
    spec: Fields, param: str, schema_of: Callable[[Fields], Fields] = lambda spec: spec
) -> StructuredOutput | None:
    """OpenAI's output format: `text` (None), `json_object` or `json_schema`. `schema_of`: where the
    schema's fields are (chat's response_format nests them in `json_schema`; the Responses API's
    `text.format` holds them itself). `param` names the field in the engine's errors."""
    kind = spec.get_str("type", None)
    if kind == "text":
        spec.check_unknown()
        return None
    if kind == "json_object":
        spec.check_unknown()
        return StructuredOutput(json_object=True, param=param)
    if kind != "json_schema":
        name = spec.name("type")
        raise bad_request(f"'{name}' must be one of text, json_object, json_schema, got {kind!r}", name)
    schema_spec = schema_of(spec)
    schema_spec.get_str("name", None)
    schema_spec.get_str("description", None)
    schema_spec.get_bool("strict", False)
    schema = schema_spec.raw("schema")
    if not isinstance(schema, dict):
        name = schema_spec.name("schema")
        raise bad_request(f"'{name}' must be a JSON Schema object", name)
    if schema_spec is not spec:
        schema_spec.check_unknown()
    spec.check_unknown()
    return StructuredOutput(json_schema=json.dumps(schema), param=param)


def _nested_schema(spec: Fields) -> Fields:
    schema_spec = spec.get_object("json_schema")
    if schema_spec is None:
        name = spec.name("json_schema")
        raise bad_request(f"'{name}' is required with type json_schema", name)
    return schema_spec


def _structured_outputs(fields: Fields) -> StructuredOutput | None:
    spec = fields.get_object("structured_outputs")
    if spec is None:
        return None
    kwargs = {"json_schema": _schema_text(spec, "json"), "regex": spec.get_str("regex", None),
              "choice": _choices(spec, "choice"), "grammar": spec.get_str("grammar", None),
              "json_object": spec.get_bool("json_object", False)}
    spec.check_unknown()
    return _constraint(kwargs, "structured_outputs")


def _guided(fields: Fields) -> list[StructuredOutput | None]:
    """vLLM's older spelling, one field per kind."""
    found = []
    for key, kind in _GUIDED.items():
        if kind == "json":
            value: object = _schema_text(fields, key)
        elif kind == "choice":
            value = _choices(fields, key)
        else:
            value = fields.get_str(key, None)
        if value is not None:
            found.append(_constraint({"json_schema" if kind == "json" else kind: value}, key))
    return found


def _schema_text(fields: Fields, key: str) -> str | None:
    value = fields.raw(key)
    if value is None:
        return None
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, str):
        return value
    raise bad_request(f"'{fields.name(key)}' must be a JSON Schema, as an object or as JSON text", fields.name(key))


def _choices(fields: Fields, key: str) -> tuple[str, ...] | None:
    value = fields.raw(key)
    if value is None:
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise bad_request(f"'{fields.name(key)}' must be a non-empty array of non-empty strings", fields.name(key))


def _constraint(kwargs: dict[str, object], param: str) -> StructuredOutput:
    try:
        return StructuredOutput(**kwargs, param=param)  # type: ignore[arg-type]
    except StructuredOutputError as exc:
        raise bad_request(str(exc), exc.param) from exc
