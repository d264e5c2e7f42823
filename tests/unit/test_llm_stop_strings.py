"""Offline generation honours stop strings through the incremental detokenizer."""

import pytest

from core import LLM, FinishReason, SamplingParams


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(device="cpu", max_model_len=256)


def test_stop_string_cuts_text_and_finishes_with_stop(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    full = llm.generate("The quick brown", greedy)[0]
    assert full.finish_reason == FinishReason.LENGTH
    stop = full.text[4:7]
    assert stop and stop not in full.text[:4]
    cut = llm.generate("The quick brown", SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,)))[0]
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason == FinishReason.STOP
    # Tokens end with the one that completed the stop string: a prefix of the unstopped run.
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert len(cut.token_ids) < len(full.token_ids)
    assert llm.engine.stats().num_used_blocks == 0


def test_without_a_stop_string_text_is_the_full_decode(llm: LLM) -> None:
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
