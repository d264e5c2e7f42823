"""The benchmark model: a Qwen3-0.6B-shaped random bf16 checkpoint with a tokenizer that covers its vocab.

The tests' tiny tokenizer knows a few hundred tokens, so most ids the random 0.6B model samples
would decode to nothing and a server would stream no text for them: a serving benchmark would see
too few chunks, and would not pay for detokenization as it does with a real model. This tokenizer is
a word-level one over the whole vocabulary (id i is the word "w<i>"), so every id decodes to text
and a prompt's text encodes back to the same ids (`--prompt-format text` relies on it).
"""

from pathlib import Path

import torch

from bench.random_checkpoint import QWEN3_0P6B, build_random_qwen3_0p6b


def build_word_tokenizer(directory: str | Path, vocab_size: int) -> Path:
    """Writes tokenizer.json and tokenizer_config.json: word "w<i>" is id i, words split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
    return directory


def build_bench_model(directory: str | Path) -> Path:
    """The random Qwen3-0.6B checkpoint (reused when present) with the word tokenizer beside it."""
    directory = build_random_qwen3_0p6b(directory)
    if not (directory / "tokenizer.json").exists():
        build_word_tokenizer(directory, int(QWEN3_0P6B["vocab_size"]))
    return directory


def build_small_bench_model(directory: str | Path, vocab_size: int = 10_240) -> Path:
    """A tiny random Qwen3 (float32) with the word tokenizer, for CPU runs of the benchmark scripts.

    Its vocabulary covers the workloads' prompt ids ([0, 10000)), which the tests' tiny model's does not.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=vocab_size - 1,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return build_word_tokenizer(directory, vocab_size)
