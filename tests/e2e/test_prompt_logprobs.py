"""Prompt logprobs over HTTP: completions `echo` + `logprobs` in the legacy API's shape (the lm-eval-harness
log-likelihood request), vLLM's `prompt_logprobs` on both endpoints, against transformers' log-softmax."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.e2e.serving import MODEL, RunningServer

PROMPT = "The quick brown fox jumps over the lazy dog"


def tokenize(server: RunningServer, prompt: str) -> list[int]:
    with server.http() as http:
        return http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]


def hf_logprobs(model_dir: Path, token_ids: list[int]) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = model(torch.tensor([token_ids])).logits[0].log_softmax(-1)
    return [logprobs[t - 1, token_ids[t]].item() for t in range(1, len(token_ids))]


def test_echo_with_logprobs_scores_the_prompt_as_openais_legacy_api(server: RunningServer, model_dir: Path) -> None:
    out = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1,
                                             temperature=0.0)
    choice = out.choices[0]
    ids = tokenize(server, PROMPT)
    logprobs = choice.logprobs
    assert choice.text.startswith(PROMPT) and len(logprobs.tokens) == len(ids) + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1 : len(ids)] == pytest.approx(hf_logprobs(model_dir, ids), abs=1e-4)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert logprobs.text_offset[len(ids)] == len(PROMPT)  # the generated token starts after the prompt
    assert all(len(top) >= 1 for top in logprobs.top_logprobs[1:])
    assert out.usage.completion_tokens == 1


def test_vllm_prompt_logprobs_on_completions_and_chat(server: RunningServer) -> None:
    client = server.client()
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 2})
    entries = out.choices[0].model_extra["prompt_logprobs"]
    ids = tokenize(server, PROMPT)
    assert len(entries) == len(ids) and entries[0] is None
    for token_id, entry in zip(ids[1:], entries[1:], strict=True):
        assert str(token_id) in entry and entry[str(token_id)]["rank"] >= 1
        assert len(entry) in (2, 3) and any(e["rank"] == 1 for e in entry.values())
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                          extra_body={"prompt_logprobs": 0})
    assert chat.model_extra["prompt_logprobs"][0] is None and len(chat.model_extra["prompt_logprobs"]) > 3
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})
