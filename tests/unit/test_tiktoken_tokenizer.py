"""A model whose tokenizer is a tiktoken BPE file (as Llama 3's original release, Qwen-1 and Kimi ship
theirs): the test writes one from the tiny model's vocabulary and checks our tokenizer against the
`tiktoken` library itself, then serves the model with it."""

import base64
import json
from pathlib import Path

import pytest
import tiktoken
from transformers.convert_slow_tokenizer import bytes_to_unicode

from core import LLM, SamplingParams
from core.tiny_model import build_tiny_model
from core.tokenizer import load_tokenizer

# The split pattern transformers' tiktoken converter uses when the files name none (Llama 3's).
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
TEXTS = ["Hello! How are you today?", "What is the capital of France? Paris.", "12345 + 678 = 7023", "café 你好 🙂 🚀",
         "<|im_start|>user\nHi<|im_end|>\n", "  spaces\n\n\ttabs  "]


def write_tiktoken_model(directory: Path, file_name: str) -> tuple[Path, tiktoken.Encoding]:
    """The tiny model with its tokenizer.json replaced by a tiktoken file: the byte-level vocabulary as
    raw bytes ranked in merge order, the special tokens after it."""
    build_tiny_model(directory)
    vocab_json = json.loads((directory / "tokenizer.json").read_text())
    specials = [t["content"] for t in vocab_json["added_tokens"]]
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks: dict[bytes, int] = {}
    for text, _ in sorted(vocab_json["model"]["vocab"].items(), key=lambda item: item[1]):
        if text not in specials:
            ranks[bytes(byte_of[c] for c in text)] = len(ranks)
    special_ids = {token: len(ranks) + i for i, token in enumerate(specials)}
    (directory / file_name).write_text("".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in ranks.items()))
    (directory / "tokenizer.json").unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "added_tokens_decoder": {str(i): {"content": t, "special": True} for t, i in special_ids.items()},
    }))
    config = json.loads((directory / "config.json").read_text())
    config.update(eos_token_id=special_ids["<|im_end|>"], pad_token_id=special_ids["<|endoftext|>"])
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").unlink(missing_ok=True)
    return directory, tiktoken.Encoding("test", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=special_ids)


@pytest.mark.parametrize("file_name", ["tiktoken.model", "tiny.tiktoken"])
def test_tokenizer_from_a_tiktoken_file_equals_tiktoken(tmp_path: Path, file_name: str) -> None:
    directory, encoding = write_tiktoken_model(tmp_path, file_name)
    assert not (directory / "tokenizer.json").exists()
    tokenizer = load_tokenizer(str(directory))
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == encoding.encode(text, allowed_special="all"), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == encoding.encode_single_token("<|im_end|>")
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_model_with_a_tiktoken_tokenizer_serves(tmp_path: Path) -> None:
    directory, encoding = write_tiktoken_model(tmp_path, "tiny.tiktoken")
    llm = LLM(str(directory), device="cpu", kv_cache_blocks=32)
    [out] = llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert out.prompt_token_ids == encoding.encode("The capital of France is")
    assert len(out.token_ids) == 8 and out.text == encoding.decode(out.token_ids)
