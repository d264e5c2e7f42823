"""Anthropic's Messages API as a client without the SDK checks it: its error shape."""

import httpx


def assert_anthropic_error(response: httpx.Response, status: int) -> dict:
    """An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`; returns the inner error."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["message"]
    return body["error"]
