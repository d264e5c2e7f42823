"""Bad input end to end: always a 4xx in OpenAI's error shape that names the parameter, never a
500, and never any effect on the requests running next to it."""

import threading

import openai
import pytest

from tests.e2e.serving import MODEL, RunningServer, assert_error_shape
from tests.e2e.sse_client import post_stream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
C = {"model": MODEL, "prompt": "Hello"}
M = {"model": MODEL, "messages": MESSAGES}

# (path, body, status, param)
BAD_BODIES = [
    (COMPLETIONS, {"prompt": "Hello"}, 400, "model"),
    (COMPLETIONS, {"model": "gpt-4o", "prompt": "Hello"}, 404, "model"),
    (COMPLETIONS, {"model": MODEL}, 400, "prompt"),
    (COMPLETIONS, C | {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, C | {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, C | {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, C | {"prompt": ["ok", 5]}, 400, "prompt"),
    (COMPLETIONS, C | {"prompt": [1, -2]}, 400, "prompt"),
    (COMPLETIONS, C | {"prompt": [1, 99999]}, 400, "prompt"),  # outside the vocabulary
    (COMPLETIONS, C | {"prompt": list(range(3, 503)) * 2}, 400, "prompt"),  # longer than the context
    (COMPLETIONS, C | {"prompt": [5, 6], "max_tokens": 600}, 400, "max_tokens"),
    (COMPLETIONS, C | {"max_tokens": 0}, 400, "max_tokens"),
    (COMPLETIONS, C | {"max_tokens": 1.5}, 400, "max_tokens"),
    (COMPLETIONS, C | {"max_tokens": "10"}, 400, "max_tokens"),
    (COMPLETIONS, C | {"temperature": "hot"}, 400, "temperature"),
    (COMPLETIONS, C | {"temperature": -1}, 400, "temperature"),
    (COMPLETIONS, C | {"top_p": 0}, 400, "top_p"),
    (COMPLETIONS, C | {"top_k": -5}, 400, "top_k"),
    (COMPLETIONS, C | {"min_p": 2}, 400, "min_p"),
    (COMPLETIONS, C | {"n": 0}, 400, "n"),
    (COMPLETIONS, C | {"n": 129}, 400, "n"),
    (COMPLETIONS, C | {"n": True}, 400, "n"),
    (COMPLETIONS, C | {"seed": 2**70}, 400, "seed"),
    (COMPLETIONS, C | {"stop": [1, 2]}, 400, "stop"),
    (COMPLETIONS, C | {"stop": [""]}, 400, "stop"),
    (COMPLETIONS, C | {"stop_token_ids": [-1]}, 400, "stop_token_ids"),
    (COMPLETIONS, C | {"stop_token_ids": [100000], "min_tokens": 1, "max_tokens": 2}, 400, "stop_token_ids"),
    (CHAT, M | {"stop_token_ids": [2**64 - 1]}, 400, "stop_token_ids"),
    (COMPLETIONS, C | {"min_tokens": 20, "max_tokens": 5}, 400, "min_tokens"),
    (COMPLETIONS, C | {"stream": "yes"}, 400, "stream"),
    (COMPLETIONS, C | {"stream_options": {"include_usage": True}}, 400, "stream_options"),
    (COMPLETIONS, C | {"stream": True, "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage"),
    (COMPLETIONS, C | {"logprobs": 21}, 400, "logprobs"),
    (COMPLETIONS, C | {"logprobs": -1}, 400, "logprobs"),
    (COMPLETIONS, C | {"echo": True, "logprobs": 1, "stream": True}, 400, "echo"),
    (COMPLETIONS, C | {"prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),
    (COMPLETIONS, C | {"prompt_logprobs": 21}, 400, "prompt_logprobs"),
    (COMPLETIONS, C | {"suffix": "end"}, 400, "suffix"),
    (COMPLETIONS, C | {"best_of": 3}, 400, "best_of"),
    (COMPLETIONS, C | {"presence_penalty": 2.5}, 400, "presence_penalty"),
    (COMPLETIONS, C | {"frequency_penalty": "1"}, 400, "frequency_penalty"),
    (COMPLETIONS, C | {"repetition_penalty": 0}, 400, "repetition_penalty"),
    (COMPLETIONS, C | {"logit_bias": {"5": 101}}, 400, "logit_bias"),
    (COMPLETIONS, C | {"logit_bias": {"five": 1}}, 400, "logit_bias"),
    (COMPLETIONS, C | {"logit_bias": {"100000": 1}}, 400, "logit_bias"),
    (COMPLETIONS, C | {"structured_outputs": {"regex": "(unclosed"}}, 400, "structured_outputs"),
    (COMPLETIONS, C | {"user": 5}, 400, "user"),
    (CHAT, {"messages": MESSAGES}, 400, "model"),
    (CHAT, {"model": MODEL}, 400, "messages"),
    (CHAT, M | {"messages": []}, 400, "messages"),
    (CHAT, M | {"messages": "hi"}, 400, "messages"),
    (CHAT, M | {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, M | {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, M | {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    (CHAT, M | {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content[0].type"),
    (CHAT, M | {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
     400, "messages[0].tool_calls[0].function"),
    (CHAT, M | {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]},
     400, "messages[0].tool_calls[0].function.arguments"),
    (CHAT, M | {"tools": [{"type": "retrieval"}]}, 400, "tools[0].type"),
    (CHAT, M | {"tools": [{"type": "function", "function": {"description": "no name"}}]}, 400,
     "tools[0].function.name"),
    (CHAT, M | {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, 400,
     "tools[0].function.parameters"),
    (CHAT, M | {"tools": {"type": "function"}}, 400, "tools"),
    (CHAT, M | {"tool_choice": "required"}, 400, "tool_choice"),  # no tools to call
    (CHAT, M | {"tool_choice": "sometimes"}, 400, "tool_choice"),
    (CHAT, M | {"tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice.function.name"),
    (CHAT, M | {"parallel_tool_calls": "no"}, 400, "parallel_tool_calls"),
    (CHAT, M | {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
                "response_format": {"type": "json_object"}}, 400, "tool_choice"),
    (CHAT, M | {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}],
                "tool_choice": "required"}, 400, "tool_choice"),  # a schema the grammar engine would not enforce
    (CHAT, M | {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
                "ignore_eos": True}, 400, "ignore_eos"),
    (CHAT, M | {"reasoning_effort": "extreme"}, 400, "reasoning_effort"),
    (CHAT, M | {"store": "yes"}, 400, "store"),
    (CHAT, M | {"metadata": ["x"]}, 400, "metadata"),
    (CHAT, M | {"functions": [{"name": "f"}]}, 400, "functions"),
    (CHAT, M | {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strang"}}}},
     400, "response_format"),
    (CHAT, M | {"response_format": {"type": "yaml"}}, 400, "response_format.type"),
    (CHAT, M | {"top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, M | {"logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    (CHAT, M | {"chat_template": "{{ 'pwned' }}"}, 400, "chat_template"),
    (CHAT, M | {"chat_template_kwargs": []}, 400, "chat_template_kwargs"),
    (CHAT, M | {"continue_final_message": True}, 400, "continue_final_message"),
    (CHAT, M | {"max_tokens": 600}, 400, "max_tokens"),
    (CHAT, M | {"max_completion_tokens": 600}, 400, "max_completion_tokens"),
    (CHAT, M | {"messages": [{"role": "user", "content": "hello " * 600}]}, 400, "messages"),
    (CHAT, M | {"audio": {"voice": "alloy"}}, 400, "audio"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/detokenize", {"tokens": [1, 100000]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_BODIES)
def test_bad_bodies_get_a_4xx_naming_the_parameter(
    server: RunningServer, path: str, body: dict, status: int, param: str
) -> None:
    with server.http() as http:
        for stream in (False, True):  # validation happens before any streaming starts
            if path in (CHAT, COMPLETIONS) and stream and "stream" not in body and "stream_options" not in body:
                response = http.post(path, json=body | {"stream": True})
            else:
                response = http.post(path, json=body)
            assert assert_error_shape(response, status)["param"] == param


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe", b"[1, 2]", b'"text"', b"null", b"42"])
@pytest.mark.parametrize("path", [COMPLETIONS, CHAT, "/tokenize", "/detokenize"])
def test_malformed_or_non_object_json(server: RunningServer, raw: bytes, path: str) -> None:
    with server.http() as http:
        response = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert_error_shape(response, 400)


def test_unknown_route_and_wrong_method(server: RunningServer) -> None:
    with server.http() as http:
        assert assert_error_shape(http.get("/v1/engines"), 404)["code"] == "not_found"
        assert assert_error_shape(http.post("/v1/fine_tuning/jobs", json={}), 404)["code"] == "not_found"
        assert assert_error_shape(http.get(COMPLETIONS), 405)["code"] == "method_not_allowed"
        assert_error_shape(http.get("/v1/models/gpt-4o"), 404)


def test_sdk_raises_typed_errors(server: RunningServer) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="nope", prompt="hi")
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, presence_penalty=3.0)
    assert bad.value.param == "presence_penalty"


def test_defaults_of_unsupported_parameters_are_accepted(server: RunningServer) -> None:
    out = server.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, presence_penalty=0, frequency_penalty=0, logit_bias={},
        tools=[], tool_choice="none", response_format={"type": "text"}, user="someone", n=1,
    )
    assert out.usage.completion_tokens <= 2


def test_bad_requests_do_not_disturb_a_running_stream(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Prefix caching", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with server.http() as http:
        alone = post_stream(http, COMPLETIONS, body).chunks
    results: dict[str, list] = {}
    thread = threading.Thread(target=lambda: results.setdefault("chunks", post_stream(server.http(), COMPLETIONS,
                                                                                      body).chunks))
    thread.start()
    with server.http() as http:
        for path, bad, status, _ in BAD_BODIES * 2:
            assert http.post(path, json=bad).status_code == status
            assert http.post(path, content=b"{oops").status_code == 400
    thread.join(timeout=60)
    texts = [[c["choices"][0]["text"] for c in chunks] for chunks in (alone, results["chunks"])]
    assert "".join(texts[0]) == "".join(texts[1])
    assert server.wait_idle()["num_kv_blocks_used"] == 0
