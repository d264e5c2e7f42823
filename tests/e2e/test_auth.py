"""API key, CORS and the body size limit, on a server started with --api-key, one allowed origin
and a small body limit."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from openai_serve import __version__
from tests.e2e.anthropic_api import assert_anthropic_error
from tests.e2e.serving import MODEL, RunningServer, assert_error_shape, server_config, start_server

KEY = "sk-test-0123456789"
ORIGIN = "http://chat-ui.example"
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    config = server_config(api_key=KEY, allowed_origins=(ORIGIN,), max_request_body_bytes=LIMIT)
    running = start_server(model_dir, config)
    yield running
    running.stop()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"}])
@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                              ("POST", "/tokenize"), ("GET", "/v1/nothing-here")])
def test_missing_or_wrong_key_is_401(server: RunningServer, headers: dict, method: str, path: str) -> None:
    response = httpx.request(method, server.base_url + path, headers=headers, json={"model": MODEL, "prompt": "x"})
    assert assert_error_shape(response, 401)["code"] == "invalid_api_key"


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "wrong"}, {"x-api-key": f"Bearer {KEY}"},
                                     {"x-api-key": KEY + "x"}, {"Authorization": "Bearer wrong", "x-api-key": "nope"}])
def test_the_messages_api_refuses_a_missing_or_wrong_key_in_anthropics_shape(server: RunningServer,
                                                                              headers: dict) -> None:
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = httpx.post(server.base_url + path, headers=headers, json=body)
        assert assert_anthropic_error(response, 401)["type"] == "authentication_error"


def test_the_key_works_as_x_api_key_everywhere_and_for_the_anthropic_sdk(server: RunningServer) -> None:
    import anthropic

    hello = [{"role": "user", "content": "Hi"}]
    assert server.anthropic().messages.create(model=MODEL, max_tokens=2, messages=hello).usage.output_tokens == 2
    for headers in ({"x-api-key": KEY}, {"x-api-key": KEY, "Authorization": "Bearer someone-elses"}):
        assert httpx.get(server.base_url + "/v1/models", headers=headers).status_code == 200
    both = {"x-api-key": KEY, "X-Api-Key": KEY}
    assert_error_shape(httpx.get(server.base_url + "/v1/models", headers=list(both.items())), 400)
    wrong = anthropic.Anthropic(base_url=server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model=MODEL, max_tokens=2, messages=hello)
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_right_key_works_for_sdk_and_health_needs_none(server: RunningServer) -> None:
    out = server.client().completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert out.choices
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert httpx.get(server.base_url + "/metrics").status_code == 200
    assert httpx.get(server.base_url + "/version").json() == {"version": __version__}
    wrong = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_cors_preflight_is_answered_before_auth(server: RunningServer) -> None:
    response = httpx.options(server.base_url + "/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in response.headers["access-control-allow-headers"].lower()
    other = httpx.options(server.base_url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_cors_headers_on_answers_including_errors(server: RunningServer) -> None:
    with server.http() as http:
        ok = http.get("/v1/models", headers={"Origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    denied = httpx.get(server.base_url + "/v1/models", headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN


def test_oversized_body_is_413_declared_or_streamed(server: RunningServer) -> None:
    big = {"model": MODEL, "prompt": "x" * (LIMIT + 10)}
    with server.http() as http:
        assert assert_error_shape(http.post("/v1/completions", json=big), 413)["code"] == "request_too_large"
        big_message = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x" * LIMIT}]}
        assert assert_anthropic_error(http.post("/v1/messages", json=big_message), 413)["type"] == "request_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
            yield b'{"model": "tiny", "prompt": "'
            for _ in range(LIMIT // 1024 + 2):
                yield b"y" * 1024
            yield b'"}'

        assert_error_shape(http.post("/v1/completions", content=chunks()), 413)
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "fine", "max_tokens": 1}).status_code == 200
