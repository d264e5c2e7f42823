"""The chat page at `/` in headless Chromium against a real server on the real default model
(SmolLM2-135M-Instruct): the model comes from /v1/models, a question gets a streamed, right answer, and
Stop mid-answer aborts the request (the server's running requests go to 0 and every KV block is free).
The key prompt and --no-web-ui need no answer that can be checked, so they use the fast tiny model.
"""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.browser import chromium, new_page
from tests.e2e.serving import RunningServer, server_config, start_server

NAME = "smollm2-135m-instruct"
# A long answer (seconds of generation on a CPU): it is still running when Stop is pressed.
LONG_QUESTION = "Write a long story about a dragon who learns to paint, with many chapters."
MAX_TOKENS = 1500


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as running:
        yield running


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[RunningServer]:
    running = start_server(smollm2_dir, server_config(served_model_names=(NAME,)), max_model_len=2048)
    yield running
    running.stop()


def test_a_streamed_answer_and_stop_mid_answer(server: RunningServer, browser: object) -> None:
    page = new_page(browser)
    page.goto(server.base_url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.locator("#model").input_value() == NAME
    assert page.locator("#api-key-row").is_hidden()
    page.fill("#system", "")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    page.fill("#prompt", "What is the capital of France?")
    page.click("#send")
    page.wait_for_function("document.querySelector('#send').disabled === false")  # the answer ended
    assert "Paris" in page.locator(".message.assistant").last.inner_text()

    before = server.wait_idle()
    page.fill("#max-tokens", str(MAX_TOKENS))
    page.fill("#prompt", LONG_QUESTION)
    page.click("#send")
    page.wait_for_function("[...document.querySelectorAll('.message.assistant')].pop().textContent.length > 20")
    assert page.locator("#stop").is_enabled() and page.locator("#send").is_disabled()
    running = server.metrics()
    page.click("#stop")
    page.wait_for_selector(".message.assistant:last-child .note")
    answer = page.locator(".message.assistant").last.inner_text()
    speed = page.locator("#speed").inner_text()
    after = server.wait_idle()
    assert running["num_requests_running"] == 1 and running["num_kv_blocks_used"] > 0
    assert after["num_requests_running"] == 0 and after["num_kv_blocks_used"] == 0
    aborted = "request_success_total{finished_reason=abort}"
    assert after[aborted] == before[aborted] + 1
    assert after["request_generation_tokens_sum"] - before["request_generation_tokens_sum"] < MAX_TOKENS
    assert answer.endswith("stopped") and len(answer) > 20
    assert "tokens/s" in speed


def test_the_page_asks_for_the_key_when_the_server_has_one(model_dir: Path, browser: object) -> None:
    running = start_server(model_dir, server_config(api_key="sk-page"))
    try:
        page = new_page(browser)
        page.goto(running.base_url + "/")
        page.wait_for_selector("#api-key-row:not([hidden])")
        assert "needs an API key" in page.locator("#status").inner_text()
        page.fill("#api-key", "sk-page")
        page.locator("#api-key").dispatch_event("change")
        page.wait_for_function("document.querySelector('#model').options.length > 0")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "5")
        page.fill("#prompt", "Hello")
        page.press("#prompt", "Enter")  # Enter sends
        # The exact count (no "~") comes with the usage chunk at the end of the stream.
        page.wait_for_function("/^[1-5] tokens/.test(document.querySelector('#speed').textContent)")
        assert page.locator(".message.user").inner_text() == "Hello"
    finally:
        running.stop()


def test_no_web_ui_leaves_the_root_a_404(model_dir: Path) -> None:
    running = start_server(model_dir, server_config(web_ui=False))
    try:
        assert httpx.get(running.base_url + "/").status_code == 404
        assert httpx.get(running.base_url + "/ui/chat.js").status_code == 404
    finally:
        running.stop()
