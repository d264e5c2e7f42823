"""A corpus of bad input over every endpoint: each case is a 4xx in OpenAI's error shape (naming the
field where there is one), and afterwards the server is healthy, its engine never restarted, every
KV block free, and a good request answered. It includes each request that once killed the engine or
stalled the server."""

from dataclasses import dataclass

import httpx
import pytest

from tests.e2e.serving import MODEL, RunningServer, assert_error_shape

C, M, R = "/v1/completions", "/v1/chat/completions", "/v1/responses"
TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"
GOOD_C = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
GOOD_M = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GOOD_R = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
VOCAB, CONTEXT = 512, 512  # the tiny model's
OVER_CONTEXT_CHARS = "x" * (CONTEXT * 20)  # more characters than the context holds as tokens, whatever they are


@dataclass(frozen=True)
class Case:
    path: str
    body: object  # JSON, or bytes sent as they are
    status: int
    param: str | None = None  # the field the error names, where it must name one
    method: str = "POST"

    @property
    def id(self) -> str:
        return f"{self.method} {self.path} {str(self.body)[:70]}"


def field_cases(path: str, good: dict, field: str, values: list[object], param: str | None = None,
                status: int = 400) -> list[Case]:
    return [Case(path, good | {field: value}, status, param or field) for value in values]


SAMPLING = {  # a field of both generation endpoints, and values it must refuse
    "temperature": [-1, -1e-9, "hot", [], {}, True],
    "top_p": [0, 1.5, -0.1, "x", False],
    "top_k": [-5, 1.5, "x", [3]],
    "min_p": [-0.1, 2, "x"],
    "n": [0, -1, 129, 1.5, True, "2"],
    "seed": [2**63, -(2**63) - 1, 2**64 - 1, 2**70, -(2**70), "x", 1.5],  # vLLM's range: a signed 64-bit integer
    "min_tokens": [-1, "x", 2.5],
    "presence_penalty": [3, -3, "x"],
    "frequency_penalty": [2.5, "x"],
    "repetition_penalty": [0, -1, "x"],
    "stop": [[1, 2], [""], 5, {"a": 1}, ["x"] * 65, ["x" * 257]],
    "stop_token_ids": [[-1], [VOCAB], [100_000], [2**63], [2**64 - 1], "x", [1.5], 5],
    "logit_bias": [{"abc": 1}, {"5": 200}, {str(VOCAB): 1}, {"18446744073709551615": 1}, {"-1": 1}, [], "x"],
    "ignore_eos": ["yes", 1],
    "skip_special_tokens": ["no"],
    "stream": ["yes", 1, {}],
    "user": [5, []],
    "response_format": [{"type": "xml"}, "json", {"type": "json_schema"}],
}
COMPLETIONS_ONLY = {
    "max_tokens": [0, -1, 1.5, "10", 10**12, CONTEXT],
    "logprobs": [21, -1, "x"],
    "echo": ["x"],
    "suffix": ["end"],
    "best_of": [3, "x"],
    "add_special_tokens": ["yes"],
    "prompt": ["", [], [[]], ["ok", 5], [1, -2], [1, VOCAB], [1, 100_000], [1, 2**63], [1, 2**64 - 1], [1.5],
               {"a": 1}, True, 5, list(range(3, 3 + CONTEXT)), ["a"] * 257, OVER_CONTEXT_CHARS,
               [OVER_CONTEXT_CHARS], [[1, 2], [3, -1]], [[1] * CONTEXT]],
}
CHAT_ONLY = {
    "max_tokens": [0, -1, "10", CONTEXT],
    "max_completion_tokens": [0, CONTEXT, "x"],
    "logprobs": ["yes", 1],
    "top_logprobs": [2, 50, -1],
    "messages": [[], "hi", [{"content": "hi"}], [{"role": "wizard", "content": "hi"}],
                 [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image_url"}]}],
                 [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user"}], [5], [None],
                 [{"role": "assistant", "tool_calls": [{"id": "1"}]}],
                 [{"role": "assistant", "tool_calls": "x"}],
                 [{"role": "user", "content": "x"}] * (CONTEXT + 1),
                 [{"role": "user", "content": OVER_CONTEXT_CHARS}],
                 [{"role": "user", "content": [{"type": "text", "text": OVER_CONTEXT_CHARS}]}]],
    "tools": [{"type": "function"}, [{"type": "retrieval"}], [{"type": "function", "function": {}}], "x"],
    "tool_choice": ["sometimes", 5, {"type": "function", "function": {"name": "missing"}}],
    "parallel_tool_calls": ["no"],
    "reasoning_effort": ["extreme", 5],
    "chat_template": ["{{ 'pwned' }}"],
    "chat_template_kwargs": [[], "x", {"tokenize": True}],
    "continue_final_message": [True, "x"],
    "add_generation_prompt": ["x"],
    "stream_options": [{"include_usage": True}],
    "audio": [{"voice": "alloy"}],
    "modalities": [["audio"]],
    "functions": [[{"name": "f"}]],
    "store": ["yes"],
    "metadata": [["x"]],
}
RESPONSES_ONLY = {
    "input": [5, [], [{"role": "wizard", "content": "x"}], [{"type": "unknown"}], OVER_CONTEXT_CHARS],
    "max_output_tokens": [0, -1, "x", CONTEXT],
    "temperature": [-1, "x"],
    "top_p": [0, 2],
    "previous_response_id": [5],
    "instructions": [5, []],
    "background": ["x"],
}
MALFORMED = [b"{not json", b"", b"\xff\xfe", b"[1, 2]", b'"text"', b"null", b"42", b"NaN", b'{"a": 1}{',
             b"[" * 5000 + b"]" * 5000, b'{"model": "tiny", "prompt": "\\ud800"', b"\x00"]


def corpus() -> list[Case]:
    cases: list[Case] = []
    for path, good, own in ((C, GOOD_C, COMPLETIONS_ONLY), (M, GOOD_M, CHAT_ONLY)):
        for field, values in {**SAMPLING, **own}.items():
            base = {k: v for k, v in good.items() if k != "max_tokens"} if field == "max_completion_tokens" else good
            cases += field_cases(path, base, field, values)
        cases += [Case(path, {k: v for k, v in good.items() if k != "model"}, 400, "model"),
                  Case(path, good | {"model": "gpt-4o"}, 404, "model"),
                  Case(path, good | {"model": 5}, 400, "model")]
    cases.append(Case(C, GOOD_C | {"prompt": ["a", "b", "c"], "n": 100}, 400, "n"))  # 300 generations
    # Answered 500 once: choice 1's seed + 1 was out of range.
    cases += [Case(path, good | {"seed": 2**64 - 1, "n": 2}, 400, "seed") for path, good in ((C, GOOD_C), (M, GOOD_M))]
    # Each once killed the engine: the sampler indexed the logits with them.
    cases += [Case(path, good | {"stop_token_ids": [ids], "min_tokens": 1}, 400, "stop_token_ids")
              for path, good in ((C, GOOD_C), (M, GOOD_M)) for ids in (VOCAB, 100_000, 2**63 - 1)]
    for field, values in RESPONSES_ONLY.items():
        cases += field_cases(R, GOOD_R, field, values)
    cases += [Case(R, {"input": "hi"}, 400, "model"), Case(R, GOOD_R | {"model": "gpt-4o"}, 404, "model"),
              Case(R, GOOD_R | {"previous_response_id": "resp_missing"}, 404, "previous_response_id")]
    cases += [
        Case(TOKENIZE, {"prompt": 5}, 400, "prompt"), Case(TOKENIZE, {}, 400, "prompt"),
        Case(TOKENIZE, {"prompt": OVER_CONTEXT_CHARS}, 400, "prompt"),
        Case(TOKENIZE, {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
        Case(TOKENIZE, {"prompt": "x", "return_token_strs": 1}, 400, "return_token_strs"),
        Case(TOKENIZE, {"model": "other", "prompt": "x"}, 404, "model"),
        Case(TOKENIZE, {"messages": []}, 400, "messages"), Case(TOKENIZE, {"messages": "x"}, 400, "messages"),
        Case(TOKENIZE, {"messages": [{"role": "user", "content": "x"}] * (CONTEXT + 1)}, 400, "messages"),
        Case(TOKENIZE, {"messages": [{"role": "user", "content": OVER_CONTEXT_CHARS}]}, 400, "messages"),
        Case(DETOKENIZE, {}, 400, "tokens"), Case(DETOKENIZE, {"tokens": "abc"}, 400, "tokens"),
        Case(DETOKENIZE, {"tokens": [1, VOCAB]}, 400, "tokens"), Case(DETOKENIZE, {"tokens": [-1]}, 400, "tokens"),
        Case(DETOKENIZE, {"tokens": [2**63]}, 400, "tokens"), Case(DETOKENIZE, {"tokens": [1.5]}, 400, "tokens"),
        Case(DETOKENIZE, {"tokens": [1] * (CONTEXT + 1)}, 400, "tokens"),
        Case(DETOKENIZE, {"model": "other", "tokens": [1]}, 404, "model"),
    ]
    for path in (C, M, R, TOKENIZE, DETOKENIZE):
        cases += [Case(path, raw, 400) for raw in MALFORMED]
    cases += [Case(path, None, status, method=method) for method, path, status in [
        ("GET", C, 405), ("PUT", M, 405), ("DELETE", "/v1/models", 405), ("POST", "/health", 405),
        ("POST", "/metrics", 405), ("GET", "/v1/engines", 404), ("POST", "/v1/fine_tuning/jobs", 404),
        ("GET", "/v1/models/gpt-4o", 404), ("GET", "/v2/completions", 404), ("GET", "/v1/responses/resp_x", 404),
        ("DELETE", "/v1/responses/resp_x", 404), ("POST", "/v1/responses/resp_x/cancel", 404)]]
    return cases


CORPUS = corpus()


def send(http: httpx.Client, case: Case) -> httpx.Response:
    if case.body is None:
        return http.request(case.method, case.path)
    if isinstance(case.body, bytes):
        return http.post(case.path, content=case.body, headers={"content-type": "application/json"})
    return http.post(case.path, json=case.body)


@pytest.fixture(scope="module")
def held(figures: dict[str, object]) -> dict[str, int]:
    counts = {"tried": 0, "held": 0}
    yield counts
    figures["bad_input"] = counts


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_bad_input_is_a_4xx_in_openais_shape(server: RunningServer, case: Case, held: dict[str, int]) -> None:
    held["tried"] += 1
    with server.http() as http:
        response = send(http, case)
    error = assert_error_shape(response, case.status)
    if case.param is not None:  # the field, or a part of it (`messages[0].role`, `response_format.type`)
        assert error["param"] == case.param or error["param"].startswith((f"{case.param}.", f"{case.param}[")), error
    held["held"] += 1


@pytest.mark.parametrize(("path", "good"), [(C, GOOD_C), (M, GOOD_M)])
def test_the_largest_seed_with_n_2_wraps_its_second_choices_seed(server: RunningServer, path: str, good: dict) -> None:
    """Choice 1 samples with seed + 1, wrapped as signed 64-bit arithmetic wraps: what seed -2**63 draws."""
    sampled = good | {"temperature": 1.0, "max_tokens": 8, "ignore_eos": True}
    with server.http() as http:
        both = http.post(path, json=sampled | {"seed": 2**63 - 1, "n": 2})
        wrapped = http.post(path, json=sampled | {"seed": -(2**63)})
    assert both.status_code == 200 and wrapped.status_code == 200, both.text + wrapped.text
    assert choice_text(both.json()["choices"][1]) == choice_text(wrapped.json()["choices"][0])


def choice_text(choice: dict) -> str:
    return choice["text"] if "text" in choice else choice["message"]["content"]


def test_the_corpus_is_large_and_the_server_healthy_after_it(server: RunningServer) -> None:
    assert len(CORPUS) >= 200
    with server.http() as http:
        assert http.get("/health").json() == {"status": "ok", "engine_restarts": 0}
        assert http.post(C, json=GOOD_C).json()["usage"]["completion_tokens"] == 2
    assert server.wait_idle()["num_kv_blocks_used"] == 0
