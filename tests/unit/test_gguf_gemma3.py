"""GGUF -> checkpoint for Gemma 3, on a small file the test writes as llama.cpp would (tests/gguf_files.py: Gemma's
norm names, +1 on every norm weight, Q8_0 and Q5_0 tensors). Oracles: gguf's own dequantization of each tensor,
the weights the file was written from, and transformers' own GGUF loader (same tensors, same greedy tokens past
the sliding window). tests/parity/test_parity_gemma3_gguf.py does the same on the real Gemma 3 270M (Q4_K, Q6_K)."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file

from core.model_files.gguf_checkpoint import gguf_checkpoint
from core.tiny_model import TinyModelSpec, build_tiny_model
from tests.gguf_files import assert_transformers_gguf_loader_agrees, gguf_name, write_llama_gguf

# Six layers: the pattern a Gemma 3 GGUF implies (its metadata holds no layer types) has five sliding and one full.
SPEC = TinyModelSpec(architecture="gemma3", num_layers=6, num_heads=2, num_kv_heads=1, head_dim=256, seed=9,
                     perturbs_norms=True, overrides=(("sliding_window", 16), ("query_pre_attn_scalar", 256)))
QUANTIZED = {"token_embd": GGMLQuantizationType.Q8_0, "attn_q": GGMLQuantizationType.Q5_0,
             "attn_output": GGMLQuantizationType.Q8_0, "ffn_down": GGMLQuantizationType.Q5_0}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the tiny checkpoint, the GGUF written from it, that GGUF converted back)."""
    gemma3_dir = build_tiny_model(tmp_path_factory.mktemp("gemma3"), SPEC)
    gguf_path = write_llama_gguf(gemma3_dir, tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf", QUANTIZED, "gemma3")
    return gemma3_dir, gguf_path, gguf_checkpoint(gguf_path, tmp_path_factory.mktemp("cache"), "float32")


def test_tensors_are_the_files_with_the_norm_shift_undone(files: tuple[Path, Path, Path]) -> None:
    gemma3_dir, gguf_path, converted = files
    ours = load_file(str(next(converted.glob("*.safetensors"))))
    original = load_file(str(gemma3_dir / "model.safetensors"))
    file_tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    assert set(ours) == set(original)
    for name, weight in ours.items():
        tensor = file_tensors[gguf_name(name, "gemma3")]
        expected = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if name.endswith("norm.weight"):
            expected = expected - np.float32(1.0)
            torch.testing.assert_close(weight, original[name], rtol=0, atol=1e-6)  # (w + 1) - 1, in float32
        assert torch.equal(weight, torch.from_numpy(expected)), name
    assert {t.tensor_type.name for t in file_tensors.values()} == {"Q8_0", "Q5_0", "F32"}


def test_config_comes_from_the_metadata(files: tuple[Path, Path, Path]) -> None:
    gemma3_dir, _, converted = files
    config, original = (json.loads((d / "config.json").read_text()) for d in (converted, gemma3_dir))
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "sliding_window", "query_pre_attn_scalar", "hidden_activation", "vocab_size"):
        assert config[key] == original[key], key


def test_transformers_gguf_loader_agrees(files: tuple[Path, Path, Path]) -> None:
    _, gguf_path, converted = files
    assert_transformers_gguf_loader_agrees(gguf_path, converted, [[5, 17, 99, 300, 42], [7, 9] * 20,
                                                                  list(range(3, 70))])  # past the 16-token window
