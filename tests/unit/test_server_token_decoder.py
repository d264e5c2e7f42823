"""The detokenizer's decode on the event loop: the Rust tokenizer directly where that gives exactly
transformers' text, transformers' decode everywhere else."""

import random
from pathlib import Path

import pytest

from core.tokenizer import load_tokenizer
from openai_serve.token_decoder import RustDecoder, token_decoder


@pytest.fixture
def tokenizer(tiny_qwen3_dir: Path) -> object:
    return load_tokenizer(str(tiny_qwen3_dir))


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_fast_decode_gives_transformers_text(tokenizer: object, skip_special_tokens: bool) -> None:
    decoder = token_decoder(tokenizer)  # type: ignore[arg-type]
    assert isinstance(decoder, RustDecoder)
    rng = random.Random(0)
    vocab = len(tokenizer)  # type: ignore[arg-type]
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]  # special ids (0-2) included
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)  # type: ignore[attr-defined]
        assert decoder.decode(ids, skip_special_tokens=skip_special_tokens) == expected


def test_a_tokenizer_that_rewrites_the_text_keeps_transformers_decode(tokenizer: object) -> None:
    tokenizer.clean_up_tokenization_spaces = True  # type: ignore[attr-defined]
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True  # type: ignore
    assert token_decoder(tokenizer) is tokenizer  # type: ignore[arg-type]


def test_a_subclass_with_its_own_decode_keeps_it(tokenizer: object) -> None:
    class Custom(type(tokenizer)):  # type: ignore[misc]
        def _decode(self, token_ids: list[int], **kwargs: object) -> str:
            return "custom"

    tokenizer.__class__ = Custom  # type: ignore[attr-defined]
    assert token_decoder(tokenizer) is tokenizer  # type: ignore[arg-type]
