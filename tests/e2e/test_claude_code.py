"""Claude Code, Anthropic's own agentic CLI (`@anthropic-ai/claude-code` from the npm registry), against a
real server on the default model: `claude -p` answers a prompt end to end through /v1/messages, and
a request body Claude Code really sent is replayed and well answered.

Claude Code is found in the project's `.node/` (where .ci/run installs it with npm) or on PATH; without
it the test that runs it skips. Its default system prompt and tool list are large: `--system-prompt`
and `--tools ""` shrink them, and CLAUDE_CODE_MAX_OUTPUT_TOKENS keeps its max_tokens small (a CPU
generates every one). The model is named with `--model`, as the server only answers to its served
names (routes/anthropic.py).

tests/data/claude_code/messages_request.json is the first request of `claude -p "Say hello" --tools
Read,Agent --model local` (Claude Code 2.1.197, CLAUDE_CODE_MAX_OUTPUT_TOKENS=64): its path, its
headers but the API key, and its body, with the default system prompt, two tools and a
mid-conversation system message.
"""

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.serving import RunningServer, server_config, start_server
from tests.e2e.sse_client import iter_typed_events

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "data" / "claude_code" / "messages_request.json"
NAME = "smollm2-135m-instruct"
KEY = "sk-local-claude-code"
STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded")


def claude_command() -> str | None:
    local = ROOT / ".node" / "node_modules" / ".bin" / "claude"
    return str(local) if local.exists() else shutil.which("claude")


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> Iterator[RunningServer]:
    running = start_server(smollm2_dir, server_config(served_model_names=(NAME,), api_key=KEY), max_model_len=8192,
                           num_blocks=1024)
    yield running
    running.stop()


@pytest.mark.skipif(claude_command() is None, reason="Claude Code is not installed (.ci/run installs it with npm)")
def test_claude_code_answers_a_prompt_end_to_end(smollm2: RunningServer, tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": smollm2.base_url,
           "ANTHROPIC_API_KEY": KEY, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "48"}
    command = [claude_command(), "-p", "What is the capital of France?", "--model", NAME, "--tools", "",
               "--system-prompt", "Answer in one short sentence.", "--max-turns", "1", "--output-format", "json",
               "--no-session-persistence"]
    before = smollm2.wait_idle()
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    after = smollm2.wait_idle()
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["result"].strip()
    assert result["stop_reason"] in STOP_REASONS
    # What Claude Code read from the stream's usage is what the server prefilled and generated.
    usage = result["usage"]
    assert sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("request_success_total")) == 1
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == (
        after["prompt_tokens_total"] - before["prompt_tokens_total"])
    assert usage["output_tokens"] == after["generation_tokens_total"] - before["generation_tokens_total"] > 0


def test_a_recorded_claude_code_request_is_answered(smollm2: RunningServer) -> None:
    """Replayed as sent (streamed), but for the model's name: the answer is Anthropic's event stream, whole."""
    recorded = json.loads(RECORDED.read_text())
    body = recorded["body"] | {"model": NAME}
    headers = recorded["headers"] | {"x-api-key": KEY}
    with smollm2.http() as http:
        counted = http.post("/v1/messages/count_tokens", headers=headers, json={
            key: body[key] for key in ("model", "system", "messages", "tools", "thinking", "output_config")})
        with http.stream("POST", recorded["path"], headers=headers, json=body) as response:
            assert response.status_code == 200, response.read()
            events = list(iter_typed_events(response.iter_lines()))
    assert all(name == data["type"] for name, data in events)
    data = [payload for _, payload in events]
    assert data[0]["type"] == "message_start" and data[-1] == {"type": "message_stop"}
    final = data[-2]
    assert final["type"] == "message_delta" and final["delta"]["stop_reason"] in STOP_REASONS
    assert 0 < final["usage"]["output_tokens"] <= body["max_tokens"]
    prompt = final["usage"]["input_tokens"] + final["usage"]["cache_read_input_tokens"]
    assert counted.json() == {"input_tokens": prompt} and prompt > 1000
    blocks = [d for d in data if d["type"] in ("content_block_start", "content_block_stop")]
    assert [(d["type"], d["index"]) for d in blocks] == [
        (kind, index) for index in range(len(blocks) // 2) for kind in ("content_block_start", "content_block_stop")]
