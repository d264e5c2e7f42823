"""Pooling models on CUDA against the same checkpoints on a CPU in float32: a decoder embedding model through every
paged attention backend that runs here (bfloat16, chunked and whole prompts), and BERT and ModernBERT encoders
(their own attention over torch's SDPA, float32 and bfloat16). No sentence-transformers needed: the CPU path is the
oracle here, and tests/parity checks it against sentence-transformers."""

from pathlib import Path

import numpy as np
import pytest
import torch

from core import LLM
from core.tiny_model import TinyModelSpec, build_tiny_model
from gpu.attention.backend import flash_attn_unavailable

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = [list(range(3, 3 + n)) for n in (5, 40, 77, 130)]


def _embed(model_dir: Path, device: str, dtype: str, **settings: object) -> np.ndarray:
    llm = LLM(str(model_dir), task="embed", device=device, dtype=dtype, max_model_len=256, max_num_seqs=8,
              gpu_memory_utilization=0.3, **settings)
    return np.stack(llm.embed(PROMPTS))


def _backends() -> list[str]:
    names = ["triton"]
    if torch.cuda.is_available() and flash_attn_unavailable(torch.device("cuda"), torch.bfloat16) is None:
        names.append("flash-attn")
    return names


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("decoder"), TinyModelSpec(head_dim=64, hidden_size=128))


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("budget", [32, 1024])  # chunked, whole
def test_decoder_embeddings_on_cuda(decoder: Path, backend: str, budget: int) -> None:
    reference = _embed(decoder, "cpu", "float32")
    got = _embed(decoder, "cuda", "bfloat16", attention_backend=backend, max_num_batched_tokens=budget)
    cosines = (got * reference).sum(axis=1)
    assert cosines.min() > 0.999, cosines


@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_encoder_embeddings_on_cuda(tmp_path: Path, kind: str) -> None:
    from transformers import BertConfig, BertModel, ModernBertConfig, ModernBertModel

    common = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "intermediate_size": 96, "max_position_embeddings": 256, "pad_token_id": 0}
    torch.manual_seed(0)
    model = BertModel(BertConfig(**common)) if kind == "bert" else ModernBertModel(
        ModernBertConfig(**common, local_attention=16, global_attn_every_n_layers=2))
    model.save_pretrained(tmp_path)
    build_tiny_model(tmp_path / "tokenizer")  # a tokenizer for the server side; prompts here are token ids
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tmp_path / "tokenizer" / name).read_bytes())
    reference = _embed(tmp_path, "cpu", "float32")
    np.testing.assert_allclose(_embed(tmp_path, "cuda", "float32"), reference, atol=1e-4)
    assert ((_embed(tmp_path, "cuda", "bfloat16") * reference).sum(axis=1)).min() > 0.995
