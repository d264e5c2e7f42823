"""Request fields into SamplingParams: penalties, logit_bias and every way to ask for structured output."""

import json

import pytest

from core.structured_output import StructuredOutput
from openai_serve.errors import APIError
from openai_serve.protocol.chat import parse_chat_request
from openai_serve.protocol.completions import parse_completion_request

M = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
C = {"model": "m", "prompt": "hi"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_penalties_and_logit_bias_reach_sampling_params() -> None:
    params = parse_completion_request(C | {"presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
                                           "logit_bias": {"7": 100, "3": -100}}).common.sampling
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1.0, 1.2)
    assert params.logit_bias == ((3, -100.0), (7, 100.0))


@pytest.mark.parametrize(("extra", "expected"), [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredOutput(json_object=True)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredOutput(json_schema=json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutput(json_schema=json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, StructuredOutput(json_schema=json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "a+"}}, StructuredOutput(regex="a+")),
    ({"structured_outputs": {"choice": ["x", "y"]}}, StructuredOutput(choice=("x", "y"))),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, StructuredOutput(grammar='root ::= "a"')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutput(json_object=True)),
    ({"guided_regex": "b+"}, StructuredOutput(regex="b+")),
    ({"guided_choice": ["p"]}, StructuredOutput(choice=("p",))),
    ({"guided_json": SCHEMA}, StructuredOutput(json_schema=json.dumps(SCHEMA))),
])
def test_every_spelling_of_structured_output(extra: dict, expected: StructuredOutput | None) -> None:
    assert parse_chat_request(M | extra).common.sampling.structured_output == expected
    assert parse_completion_request(C | extra).common.sampling.structured_output == expected


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "toml"}}, "response_format.type"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": 5}}, "structured_outputs.json"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"logit_bias": ["5"]}, "logit_bias"),
    ({"logit_bias": {"-5": 1}}, "logit_bias"),
    ({"response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens"),
])
def test_bad_structured_output_fields_name_themselves(extra: dict, param: str) -> None:
    with pytest.raises(APIError) as raised:
        parse_chat_request(M | extra)
    assert raised.value.to_dict()["error"]["param"] == param
