"""The decode that the incremental detokenizer calls twice per streamed token, on the event loop.

transformers' `tokenizer.decode` spends most of its time around the Rust decode (converting
arguments, dispatching, keyword handling): on this server's hot path that was most of the
detokenizer's cost. For a tokenizer backed by the `tokenizers` library whose `decode` does nothing
after the Rust decode, calling the Rust tokenizer directly gives the same text; anything else keeps
transformers' decode.
"""

from transformers import PreTrainedTokenizerBase

from core.detokenizer import TokenDecoder


class RustDecoder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._decode = tokenizer.backend_tokenizer.decode

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._decode(token_ids, skip_special_tokens=skip_special_tokens)


def token_decoder(tokenizer: PreTrainedTokenizerBase) -> TokenDecoder:
    """A decoder that gives exactly `tokenizer.decode`'s text, as cheaply as this tokenizer allows."""
    return RustDecoder(tokenizer) if _decodes_in_rust_only(tokenizer) else tokenizer


def _decodes_in_rust_only(tokenizer: PreTrainedTokenizerBase) -> bool:
    try:  # transformers 5's tokenizers-backed class; older versions keep their own decode
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase as Base
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or cls.decode is not Base.decode:
        return False
    return cls._decode is TokenizersBackend._decode and not _cleans_up_spaces(tokenizer)


def _cleans_up_spaces(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether TokenizersBackend._decode would rewrite the Rust decode's text (it skips the
    clean-up for BPE models unless forced)."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    is_bpe = type(tokenizer.backend_tokenizer.model).__name__ == "BPE"
    forced = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return not is_bpe or forced
