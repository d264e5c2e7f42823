"""A server that speculates (n-gram drafts, the engine in its own process): streamed and whole answers are the
answers of an engine that does not, and /metrics counts drafts and accepted tokens as vLLM's spec_decode
metrics."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from core import LLM, SamplingParams
from tests.e2e.serving import MODEL, RunningServer, start_server

PROMPTS = [[5, 6, 7, 8, 9] * 4, [40, 41, 42] * 5 + [7], list(range(100, 130))]


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = start_server(model_dir, engine_process=True,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    yield running
    running.stop()


def test_answers_equal_those_without_speculation_and_metrics_count_drafts(server: RunningServer,
                                                                          model_dir: Path) -> None:
    plain = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=512, kv_cache_blocks=64)
    want = [o.text for o in plain.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))]
    client = server.client()
    before = server.wait_idle()
    for prompt, text in zip(PROMPTS, want, strict=True):
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert whole.choices[0].text == text and whole.usage.completion_tokens == 40
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == whole.choices[0].text
    after = server.wait_idle()
    assert after["num_kv_blocks_used"] == 0
    drafts = after["spec_decode_num_draft_tokens_total"] - before.get("spec_decode_num_draft_tokens_total", 0)
    accepted = after["spec_decode_num_accepted_tokens_total"] - before.get("spec_decode_num_accepted_tokens_total", 0)
    assert drafts >= accepted > 0 and after["spec_decode_num_drafts_total"] > 0
    assert sum(v for k, v in after.items() if k.startswith("spec_decode_num_accepted_tokens_per_pos")) == \
        after["spec_decode_num_accepted_tokens_total"]
