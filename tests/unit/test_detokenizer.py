"""The incremental detokenizer against the tiny byte-level BPE tokenizer (emoji and CJK span tokens)."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from core.detokenizer import IncrementalDetokenizer
from core.tiny_model import tiny_model_dir
from tests.unit.test_stop_strings import first_stop

REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir())


def stream(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: tuple[str, ...] = (), **kwargs: bool
) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tokenizer, [], stop, **kwargs)
    deltas = [detok.add_tokens([token_id]) for token_id in ids]
    if not detok.is_stopped:
        deltas.append(detok.flush())
    return deltas, detok


def test_emoji_and_cjk_span_tokens_and_are_never_split(tokenizer: PreTrainedTokenizerBase) -> None:
    text = "你好，世界 🚀🎉 café ❤️ 日本語"
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The premise: at least one token on its own decodes to half a character.
    assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids)
    deltas, detok = stream(tokenizer, ids)
    assert "".join(deltas) == text == detok.text
    assert all(REPLACEMENT not in delta for delta in deltas)
    assert any(delta.endswith("🚀") for delta in deltas)  # the rocket arrives whole, in one delta


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab 你好世界🚀🎉👍é\n.")), max_size=30))
def test_any_text_streams_back_exactly(tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, _ = stream(tokenizer, ids)
    assert "".join(deltas) == text
    assert all(REPLACEMENT not in delta for delta in deltas)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=3, max_value=511), max_size=25))
def test_arbitrary_ids_end_as_a_full_decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> None:
    # Random ids can end mid-character; the flush then shows what a full decode shows.
    deltas, _ = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids)


def test_special_tokens_are_skipped_by_default(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("hello<|im_end|>", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids)[0]) == "hello"
    assert "".join(stream(tokenizer, ids, skip_special_tokens=False)[0]) == "hello<|im_end|>"


def test_prompt_context_does_not_leak_into_the_output(tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = tokenizer.encode("The quick brown", add_special_tokens=False)
    ids = tokenizer.encode(" fox jumps", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    assert detok.add_tokens(ids) + detok.flush() == " fox jumps"


def test_prompt_ending_mid_character_is_not_used_as_context(tokenizer: PreTrainedTokenizerBase) -> None:
    rocket = tokenizer.encode("🚀", add_special_tokens=False)
    assert len(rocket) > 1
    ids = tokenizer.encode(" hello", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, rocket[:1])
    assert detok.add_tokens(ids) + detok.flush() == " hello"


def test_stop_string_is_never_sent_and_cuts_the_text(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("The quick brown fox jumps", add_special_tokens=False)
    deltas, detok = stream(tokenizer, ids, stop=("brown",))
    assert "".join(deltas) == "The quick " == detok.text
    assert detok.stop_string == "brown"
    assert all("b" not in delta for delta in deltas)  # even its first letter was held back


def test_text_that_only_looks_like_a_stop_prefix_is_released_later(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("a brow and a brown", add_special_tokens=False)
    deltas, detok = stream(tokenizer, ids, stop=("brown fox",))
    assert "".join(deltas) == "a brow and a brown"
    assert not detok.is_stopped
    # "brown" at the very end could still become "brown fox": it came out only with the flush.
    assert deltas[-1].endswith("brown")


def test_earliest_stop_string_wins_and_later_tokens_are_ignored(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], ("four", "two"))
    text = detok.add_tokens(ids)
    assert (text, detok.stop_string) == ("one ", "two")
    assert detok.add_tokens(ids) == "" and detok.flush() == ""


def test_stop_string_made_of_emoji_spanning_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("hi 你好 🎉 bye", add_special_tokens=False)
    deltas, detok = stream(tokenizer, ids, stop=("🎉",))
    assert "".join(deltas) == "hi 你好 "
    assert detok.stop_string == "🎉"


def test_include_stop_str_in_output(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("Hello! How are you", add_special_tokens=False)
    deltas, detok = stream(tokenizer, ids, stop=("How",), include_stop_str_in_output=True)
    assert "".join(deltas) == "Hello! How" == detok.text


def test_stop_string_inside_one_token(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    deltas, detok = stream(tokenizer, ids, stop=("ell",))
    assert "".join(deltas) == "h"
    assert detok.stop_string == "ell"


@settings(max_examples=80, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab 你好🚀é.")), max_size=24),
    st.lists(st.text(alphabet=st.sampled_from(list("ab 你🚀")), min_size=1, max_size=3), min_size=1, max_size=3),
)
@example("a 🚀", [" ", "a 🚀"])  # the space completes first, though its token also starts the rocket's bytes
@example("aba", ["aba", "b"])
def test_stop_strings_cut_at_the_first_match_and_never_leak(
    tokenizer: PreTrainedTokenizerBase, text: str, stops: list[str]
) -> None:
    """Generation ends at the first stop string to complete in the text (read a character at a time),
    whatever tokens carry it and however the detokenizer waits for whole characters."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, detok = stream(tokenizer, ids, stop=tuple(stops))
    full = tokenizer.decode(ids)
    found = first_stop(full, stops)
    assert "".join(deltas) == (full if found is None else full[: found[0]]) == detok.text
    assert detok.stop_string == (None if found is None else found[1])
    included, _ = stream(tokenizer, ids, stop=tuple(stops), include_stop_str_in_output=True)
    assert "".join(included) == (full if found is None else full[: found[0] + len(found[1])])
    released = ""
    for delta in deltas:
        released += delta
        assert not any(s in released for s in stops)
