"""A GGUF's tokenizer as a transformers fast tokenizer (tokenizer.json + tokenizer_config.json).

Byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: SmolLM, Llama 3, Qwen...) are built
here from the file's tokens and merges, with the pre-tokenizer llama.cpp applies for the file's
`tokenizer.ggml.pre`; an unknown pre-tokenizer is refused rather than guessed, since it would
change the tokens. Other vocabularies (sentencepiece and the rest) go through transformers' own
GGUF tokenizer conversion. Control tokens are special tokens, kept whole in text.

End of generation: llama.cpp stops on the file's EOS and on control tokens known to end a turn
(`<|im_end|>`, `<|eot_id|>`...), which many files do not name as EOS; `end_of_generation_ids` gives
the same set, for generation_config.json.
"""

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from core.model_files.errors import ModelUnavailable

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types

# Texts of control tokens that end a turn, as llama.cpp lists them (llama-vocab.cpp).
END_OF_TURN_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    "<｜end▁of▁sentence｜>", "<end_of_utterance>",
})

_GPT2_REGEX_PRE = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


# `tokenizer.ggml.pre` -> (pre-tokenizer, ignore_merges), as llama.cpp splits text for each.
_PRE_TOKENIZERS: dict[str, tuple[pre_tokenizers.PreTokenizer, bool]] = {
    "default": (_GPT2_REGEX_PRE, False),
    "gpt-2": (_GPT2_REGEX_PRE, False),
    # digits one by one, then GPT-2's regex
    **{name: (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2_REGEX_PRE]), False)
       for name in ("smollm", "starcoder", "refact", "codeshell")},
    **{name: (_split_then_bytes(_LLAMA3_SPLIT), True) for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe")},
    **{name: (_split_then_bytes(_QWEN2_SPLIT), False) for name in ("qwen2", "deepseek-r1-qwen")},
}


def gguf_tokenizer(metadata: dict[str, object], gguf_path: Path) -> PreTrainedTokenizerBase:
    if metadata.get("tokenizer.ggml.model") == "gpt2":
        tokenizer = _byte_level_bpe(metadata)
    else:  # sentencepiece and the rest: transformers' conversion of the same metadata
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    template = metadata.get("tokenizer.chat_template")
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def end_of_generation_ids(metadata: dict[str, object]) -> list[int]:
    """The file's EOS first, then every control token that ends a turn."""
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    ids = [int(eos)] if eos is not None else []  # type: ignore[call-overload]
    tokens, types = metadata.get("tokenizer.ggml.tokens") or [], metadata.get("tokenizer.ggml.token_type") or []
    ids += [i for i, (text, kind) in enumerate(zip(tokens, types, strict=False))  # type: ignore[call-overload]
            if kind == CONTROL and text in END_OF_TURN_TEXTS and i not in ids]
    return ids


def _byte_level_bpe(metadata: dict[str, object]) -> PreTrainedTokenizerFast:
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]  # type: ignore[assignment]
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in _PRE_TOKENIZERS:
        raise ModelUnavailable(f"the GGUF's tokenizer splits text as {pre!r}, which we do not know (known: "
                               f"{sorted(_PRE_TOKENIZERS)}); pass --tokenizer with the model's own tokenizer")
    pre_tokenizer, ignore_merges = _PRE_TOKENIZERS[pre]
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or []]  # type: ignore[attr-defined]
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=ignore_merges))
    core.pre_tokenizer = pre_tokenizer
    core.decoder = decoders.ByteLevel()
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)  # type: ignore[assignment]
    core.add_special_tokens([AddedToken(t, special=True, normalized=False)
                             for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    core.add_tokens([AddedToken(t, special=False, normalized=False)
                     for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED])
    specials = {name: _token(metadata, tokens, key) for name, key in
                (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding"))}
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and specials["bos_token"] is not None
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and specials["eos_token"] is not None
    core.post_processor = _bos_eos_template(specials["bos_token"] if add_bos else None,
                                            specials["eos_token"] if add_eos else None, core)
    # transformers 5 rebuilds the post-processor from these flags; 4.x keeps the one set above.
    return PreTrainedTokenizerFast(tokenizer_object=core, add_bos_token=add_bos, add_eos_token=add_eos, **specials)


def _token(metadata: dict[str, object], tokens: list[str], key: str) -> str | None:
    token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
    return tokens[int(token_id)] if token_id is not None else None  # type: ignore[call-overload]


def _bos_eos_template(bos: str | None, eos: str | None, core: Tokenizer) -> processors.PostProcessor | None:
    """BOS (and EOS) around a prompt when the file says so (`tokenizer.ggml.add_bos_token`), as llama.cpp
    tokenizes a prompt: a GGUF is llama.cpp's format, and its flags say how the model was meant to be fed."""
    if bos is None and eos is None:
        return None
    single = ([f"{bos}:0"] if bos else []) + ["$A:0"] + ([f"{eos}:0"] if eos else [])
    special = [(t, core.token_to_id(t)) for t in dict.fromkeys((bos, eos)) if t is not None]
    return processors.TemplateProcessing(single=single, special_tokens=special)
