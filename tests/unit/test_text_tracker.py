"""The one detokenize-and-stop tracker both front ends use: a stop string finishes the request at the
token that completed it, aborts it in the engine once, and later outputs change nothing."""

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from core import FinishReason, RequestOutput, SamplingParams, TokenLogprobs
from core.text_tracker import TextTracker
from core.tiny_model import tiny_model_dir


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir())


def output(token_id: int, finish: FinishReason | None = None) -> RequestOutput:
    logprobs = TokenLogprobs(logprob=-1.0, rank=1, top_token_ids=(), top_logprobs=())
    return RequestOutput("r", [token_id], [logprobs], finish, 3, 1)


def test_a_stop_string_finishes_aborts_once_and_ignores_what_follows(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    aborted: list[str] = []
    tracker = TextTracker("r", tokenizer, [5, 6, 7], SamplingParams(stop=("three",), logprobs=0), aborted.append)
    deltas = [d for d in (tracker.absorb(output(t)) for t in ids) if d is not None]
    assert aborted == ["r"] and tracker.finish_reason is FinishReason.STOP
    assert "".join(d.text for d in deltas) == tracker.text == "one two "
    assert tokenizer.decode(tracker.token_ids).endswith("three")  # up to the token that completed it
    assert [e.token_id for d in deltas for e in d.logprobs] == tracker.token_ids  # each released once
    assert tracker.absorb(output(ids[0], FinishReason.ABORT)) is None and aborted == ["r"]


def test_the_engines_finish_flushes_held_text(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("ab🚀", add_special_tokens=False)
    aborted: list[str] = []
    tracker = TextTracker("r", tokenizer, [], SamplingParams(stop=("abc",)), aborted.append)
    texts = [tracker.absorb(output(t, FinishReason.LENGTH if i == len(ids) - 1 else None)) for i, t in enumerate(ids)]
    last = texts[-1]
    assert last is not None and last.finish_reason is FinishReason.LENGTH
    assert "".join(d.text for d in texts if d is not None) == "ab🚀" and not aborted


@pytest.mark.parametrize("include_stop_str_in_output", [False, True])
def test_the_token_that_stops_a_request_adds_no_text(
    tokenizer: PreTrainedTokenizerBase, include_stop_str_in_output: bool
) -> None:
    """With special tokens kept (as tool-call parsers of formats written in them keep them), the stop token's
    text is not part of the answer, as in vLLM; unless asked for, as stop strings are."""
    ids = tokenizer.encode("one two<|im_end|>", add_special_tokens=False)
    params = SamplingParams(skip_special_tokens=False, include_stop_str_in_output=include_stop_str_in_output)
    tracker = TextTracker("r", tokenizer, [], params, lambda request_id: None)
    deltas = [tracker.absorb(output(t, FinishReason.STOP if i == len(ids) - 1 else None)) for i, t in enumerate(ids)]
    text = "".join(d.text for d in deltas if d is not None)
    assert text == ("one two<|im_end|>" if include_stop_str_in_output else "one two")
    assert tracker.token_ids == ids and deltas[-1] is not None and deltas[-1].finish_reason is FinishReason.STOP
