"""Tiny random pooling checkpoints for the tests, built with transformers' own classes and saved by
sentence-transformers itself (its modules.json, 1_Pooling, 2_Normalize, CrossEncoder config), so the
files are what a real embedding or reranker model ships.

- `embedding_model(kind, pooling)`: a sentence-transformers model over a tiny Qwen3 (saved as the bare
  Qwen3Model sentence-transformers keeps), BERT or ModernBERT, with `pooling` (lasttoken, mean, cls),
  normalized; prompts `query` and `document`; the Qwen3 one is a Matryoshka model (config.json's keys).
- `cross_encoder()`: a BertForSequenceClassification with one label, saved by CrossEncoder.
- `yes_no_reranker()`: a Qwen3ForCausalLM whose tokenizer has "yes" and "no" tokens (Qwen3-Reranker's shape).
"""

import json
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
    ModernBertConfig,
    ModernBertModel,
    Qwen3ForCausalLM,
)

from core.tiny_model import TinyModelSpec, build_tiny_model

WORDS = ("the quick brown fox jumps over lazy dog a server streams tokens to many clients hello world how are "
         "you what is capital of france paris query document passage retrieval search answer question").split()
PROMPTS = {"query": "query: ", "document": "passage: "}
MATRYOSHKA_DIMENSIONS = [16, 32, 64]


def word_piece_tokenizer(directory: Path) -> BertTokenizerFast:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(WORDS)), *"abcdefghijklmnopqrstuvwxyz:?.,"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizerFast(vocab_file=str(directory / "vocab.txt"))


def _encoder(kind: str, directory: Path, seed: int) -> Path:
    """A bare BERT or ModernBERT checkpoint with its tokenizer."""
    tokenizer = word_piece_tokenizer(directory / "vocab")
    torch.manual_seed(seed)
    common = {"vocab_size": len(tokenizer), "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "intermediate_size": 96, "max_position_embeddings": 128, "pad_token_id": 0}
    if kind == "bert":
        model = BertModel(BertConfig(**common, initializer_range=0.2))
    else:  # local windows of 8 tokens: prompts of the tests are longer than a window
        model = ModernBertModel(ModernBertConfig(**common, local_attention=8, global_attn_every_n_layers=2,
                                                 cls_token_id=2, sep_token_id=3, initializer_range=0.2))
    model.save_pretrained(directory / "hf")
    tokenizer.save_pretrained(directory / "hf")
    return directory / "hf"


def _decoder(directory: Path, seed: int) -> Path:
    return build_tiny_model(directory / "hf", TinyModelSpec(seed=seed))


def embedding_model(root: Path, kind: str, pooling: str, normalize: bool = True, seed: int = 0) -> Path:
    from sentence_transformers import SentenceTransformer, models

    directory = root / f"{kind}-{pooling}"
    source = _decoder(directory, seed) if kind == "qwen3" else _encoder(kind, directory, seed)
    transformer = models.Transformer(str(source))
    modules = [transformer, models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, prompts=PROMPTS).save(str(directory / "st"))
    if kind == "qwen3":
        _as_qwen3_embedding_ships(directory / "st")
    return directory / "st"


def _as_qwen3_embedding_ships(directory: Path) -> None:
    """Qwen3-Embedding's files: sentence-transformers' older Transformer config, under which sentence-transformers
    reads texts as texts (a config saved by version 6 for a tokenizer with a chat template renders them as chat
    messages); and Matryoshka dimensions in config.json (vLLM's key)."""
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    config = json.loads((directory / "config.json").read_text())
    config["matryoshka_dimensions"] = MATRYOSHKA_DIMENSIONS
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def cross_encoder(root: Path, seed: int = 3) -> Path:
    from sentence_transformers import CrossEncoder

    directory = root / "cross-encoder"
    tokenizer = word_piece_tokenizer(directory / "vocab")
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=96, max_position_embeddings=128, num_labels=1, initializer_range=0.2)
    BertForSequenceClassification(config).save_pretrained(directory / "hf")
    tokenizer.save_pretrained(directory / "hf")
    CrossEncoder(str(directory / "hf")).save(str(directory / "st"))
    return directory / "st"


def yes_no_reranker(root: Path, seed: int = 4) -> Path:
    directory = build_tiny_model(root / "yes-no-reranker", TinyModelSpec(seed=seed))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(["yes", "no"])
    tokenizer.save_pretrained(directory)
    model = Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(directory)
    return directory
