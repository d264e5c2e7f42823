"""Property-based fuzzing of both generation endpoints' bodies: plausible values and arbitrary JSON in
every field the endpoints know (and some they do not). Whatever the body, the answer is a 200 that
parses (a stream ends with [DONE], without an error event) or a 4xx in OpenAI's shape: never a 5xx,
and the engine never fails (its restarts stay 0)."""

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.serving import MODEL, RunningServer, assert_error_shape
from tests.e2e.sse_client import DONE, iter_events

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
TOKEN_ID = st.integers(0, 511)  # the tiny model's vocabulary
BAD_TOKEN_ID = st.sampled_from([512, 100_000, 2**63 - 1, 600, -1])  # (the first ones are drawn most)


Field = tuple[st.SearchStrategy, st.SearchStrategy | None]  # valid values, and values just out of range


def field(valid: st.SearchStrategy, invalid: st.SearchStrategy | None = None) -> Field:
    return valid, invalid


SAMPLING = {
    "temperature": field(st.floats(0, 2) | st.sampled_from([0, 1e-39, 1e-30, 1e-6]), st.floats(-1, -1e-9)),
    "top_p": field(st.floats(0.01, 1), st.sampled_from([0, 1.5])), "top_k": field(st.integers(-1, 600), st.just(-2)),
    "min_p": field(st.floats(0, 1), st.sampled_from([-0.1, 1.1])),
    "n": field(st.integers(1, 3), st.sampled_from([0, -1, 129])),
    "seed": field(st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63, 2**64 - 1, -(2**63) - 1])),
    "stop": field(st.lists(st.text(min_size=1, max_size=4), max_size=3) | st.text(min_size=1, max_size=3),
                  st.sampled_from(["", [""], ["x"] * 65, ["y" * 257]])),
    "stop_token_ids": field(st.lists(TOKEN_ID, max_size=3), st.lists(TOKEN_ID | BAD_TOKEN_ID, min_size=1, max_size=3)
                            .filter(lambda ids: max(ids) > 511 or min(ids) < 0)),
    "min_tokens": field(st.integers(0, 4), st.just(-1)),
    "ignore_eos": field(st.booleans()),
    "logit_bias": field(st.dictionaries(TOKEN_ID.map(str), st.floats(-100, 100), max_size=3),
                        st.dictionaries((TOKEN_ID | BAD_TOKEN_ID).map(str), st.floats(-150, 150), min_size=1,
                                        max_size=3)),
    "presence_penalty": field(st.floats(-2, 2), st.just(2.5)),
    "frequency_penalty": field(st.floats(-2, 2), st.just(-3)),
    "repetition_penalty": field(st.floats(0.1, 3), st.just(0)), "stream": field(st.booleans()),
    "stream_options": field(st.fixed_dictionaries({}, optional={"include_usage": st.booleans(),
                                                                "continuous_usage_stats": st.booleans()})),
    "skip_special_tokens": field(st.booleans()), "include_stop_str_in_output": field(st.booleans()),
    "response_format": field(st.sampled_from([{"type": "text"}, {"type": "json_object"}]), st.just({"type": "xml"})),
    "user": field(st.text(max_size=5)),
}
COMPLETIONS = SAMPLING | {
    "prompt": field(st.text(min_size=1, max_size=30) | st.lists(st.text(min_size=1, max_size=8), min_size=1,
                                                                 max_size=3)
                    | st.lists(TOKEN_ID, min_size=1, max_size=12)
                    | st.lists(st.lists(TOKEN_ID, min_size=1, max_size=5), min_size=1, max_size=3),
                    st.lists(BAD_TOKEN_ID, min_size=1, max_size=3) | st.sampled_from(["", [], [[]], [2**63]])),
    "max_tokens": field(st.integers(1, 6), st.just(0)), "logprobs": field(st.integers(0, 5), st.just(21)),
    "echo": field(st.booleans()), "best_of": field(st.just(1), st.just(3)), "add_special_tokens": field(st.booleans()),
}
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                 "content": st.text(max_size=20)}, optional={"name": st.text(max_size=5)})
CHAT = SAMPLING | {
    "messages": field(st.lists(MESSAGE, min_size=1, max_size=4).map(lambda m: [*m, {"role": "user", "content": "hi"}]),
                      st.sampled_from([[], [{"role": "wizard", "content": "x"}]])),
    "max_tokens": field(st.integers(1, 6), st.just(0)), "logprobs": field(st.booleans()),
    "top_logprobs": field(st.integers(0, 5), st.just(21)),
    "tool_choice": field(st.sampled_from(["none", "auto"]), st.just("sometimes")),
    "tools": field(st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "get_weather"])}, optional={"parameters": st.just({"type": "object"})})}),
        max_size=2)),
    "reasoning_effort": field(st.sampled_from(["low", "high"])), "chat_template_kwargs": field(st.just({})),
}


@st.composite
def bodies(draw: st.DrawFn, fields: dict[str, Field], required: str) -> dict:
    """Half the bodies are valid; the others are valid but in one or two places, where a value is just out
    of range or anything at all. So both the engine and every refusal get exercised."""
    body = draw(st.fixed_dictionaries({"model": st.just(MODEL), required: fields[required][0]},
                                      optional={k: valid for k, (valid, _) in fields.items() if k != required}))
    if "stream_options" in body:
        body["stream"] = True  # (else a 400: stream_options without stream)
    if "top_logprobs" in body:
        body["logprobs"] = True  # (else a 400: top_logprobs without logprobs)
    if "min_tokens" in body:
        body["min_tokens"] = min(body["min_tokens"], body.get("max_tokens", 4))  # (else a 400: more than max_tokens)
    if required == "messages" and "max_tokens" in body and draw(st.booleans()):
        body["max_completion_tokens"] = body.pop("max_tokens")  # OpenAI's newer name
    if draw(st.booleans()):
        return body
    # Token ids reach the engine, which indexes with them: those fields are the likeliest to go wrong.
    refusable = sorted(k for k, (_, invalid) in fields.items() if invalid is not None)
    names = ["stop_token_ids", "logit_bias", required] * 3 + ["unknown_field", *refusable]
    for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):
        name = draw(st.sampled_from(names))
        invalid = fields.get(name, (None, None))[1]
        body[name] = draw(invalid if invalid is not None and draw(st.integers(0, 3)) else JSON)
    return body


STATUSES: dict[int, int] = {}


def check_answer(http: httpx.Client, path: str, body: dict) -> None:
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body = {**body, "max_tokens": 4}  # (a chat answer is otherwise as long as the context)
    with http.stream("POST", path, content=json.dumps(body), headers={"content-type": "application/json"}) as r:
        STATUSES[r.status_code] = STATUSES.get(r.status_code, 0) + 1
        assert r.status_code < 500, r.read()
        if r.status_code != 200:
            r.read()
            assert_error_shape(r, r.status_code)
        elif r.headers["content-type"].startswith("text/event-stream"):
            events = list(iter_events(r.iter_lines()))
            assert events[-1] == DONE and not any('"error"' in e[:12] for e in events), events[-3:]
        else:
            r.read()
            assert r.json()["choices"]


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


@FUZZ
@given(body=bodies(COMPLETIONS, "prompt"))
def test_completions_bodies(server: RunningServer, body: dict) -> None:
    with server.http() as http:
        check_answer(http, "/v1/completions", body)


@FUZZ
@given(body=bodies(CHAT, "messages"))
def test_chat_bodies(server: RunningServer, body: dict) -> None:
    with server.http() as http:
        check_answer(http, "/v1/chat/completions", body)


def test_no_engine_failure_and_every_block_free(server: RunningServer, figures: dict[str, object]) -> None:
    with server.http() as http:
        assert http.get("/health").json() == {"status": "ok", "engine_restarts": 0}
    assert server.wait_idle()["num_kv_blocks_used"] == 0
    figures["fuzz"] = {"examples_per_endpoint": FUZZ.max_examples, "statuses": dict(sorted(STATUSES.items()))}
