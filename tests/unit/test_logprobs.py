"""Token texts and bytes for logprobs: exact bytes for byte-level BPE pieces, `bytes:` for partial UTF-8."""

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from core.outputs import TokenLogprobs
from core.tiny_model import tiny_model_dir
from openai_serve.logprobs import TokenLogprob, TokenTexts, chat_logprobs, completion_logprobs


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir())


def test_bytes_of_tokens_rebuild_any_text(tokenizer: PreTrainedTokenizerBase) -> None:
    texts = TokenTexts(tokenizer)
    text = "héllo 你好 🚀🎉 ❤️"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(bytes(texts.get(i)[1]) for i in ids) == text.encode()
    partial = [texts.get(i)[0] for i in ids if texts.get(i)[0].startswith("bytes:")]
    assert partial and all("\\x" in t for t in partial)  # emoji pieces are written as escaped bytes


def test_special_tokens_keep_their_text(tokenizer: PreTrainedTokenizerBase) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert TokenTexts(tokenizer).get(eos) == ("<|im_end|>", list(b"<|im_end|>"))


def test_shapes_and_the_logprob_floor(tokenizer: PreTrainedTokenizerBase) -> None:
    texts = TokenTexts(tokenizer)
    a, b = tokenizer.encode("ab", add_special_tokens=False)[:1] * 2
    entry = TokenLogprob(a, TokenLogprobs(float("-inf"), 3, (b,), (-0.5,)), text_offset=0)
    legacy = completion_logprobs([entry], texts)
    assert legacy["token_logprobs"] == [-9999.0] and legacy["text_offset"] == [0]
    assert list(legacy["top_logprobs"][0].values()) == [-0.5]  # same text: the sampled one is already there
    chat = chat_logprobs([entry], texts)
    assert chat["refusal"] is None and chat["content"][0]["logprob"] == -9999.0
    assert chat["content"][0]["top_logprobs"] == [{"token": texts.get(b)[0], "logprob": -0.5,
                                                   "bytes": texts.get(b)[1]}]
