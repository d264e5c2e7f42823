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

from core import LLM, SamplingParams
from core.model_files.gguf_checkpoint import gguf_checkpoint
from core.tiny_model import TinyModelSpec, build_tiny_model
from tests.gguf_files import gguf_name, write_llama_gguf

# Six layers: the pattern a Gemma 3 GGUF implies (its metadata holds no layer types) has five sliding and one full.
SPEC = TinyModelSpec(architecture="gemma3", num_layers=6, num_heads=2, num_kv_heads=1, head_dim=256, seed=9,
                     perturbs_norms=True, overrides=(("sliding_window", 16), ("query_pre_attn_scalar", 256)))
QUANTIZED = {"token_embd": GGMLQuantizationType.Q8_0, "attn_q": GGMLQuantizationType.Q5_0,
             "attn_output": GGMLQuantizationType.Q8_0, "ffn_down": GGMLQuantizationType.Q5_0}


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gemma3"), SPEC)


@pytest.fixture(scope="module")
def gguf_path(gemma3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(gemma3_dir, tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf", QUANTIZED, "gemma3")


@pytest.fixture(scope="module")
def converted(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf_checkpoint(gguf_path, tmp_path_factory.mktemp("cache"), "float32")


def test_tensors_are_the_files_with_the_norm_shift_undone(gemma3_dir: Path, gguf_path: Path, converted: Path) -> None:
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


def test_config_comes_from_the_metadata(gemma3_dir: Path, converted: Path) -> None:
    config, original = (json.loads((d / "config.json").read_text()) for d in (converted, gemma3_dir))
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "sliding_window", "query_pre_attn_scalar", "hidden_activation", "vocab_size"):
        assert config[key] == original[key], key


def test_transformers_gguf_loader_agrees(gguf_path: Path, converted: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
    ours = load_file(str(next(converted.glob("*.safetensors"))))
    for name, weight in hf.state_dict().items():
        if name != "lm_head.weight":  # tied to the embedding
            assert torch.equal(weight, ours[name]), name
    prompts = [[5, 17, 99, 300, 42], [7, 9] * 20, list(range(3, 70))]  # past the 16-token window
    llm = LLM(str(converted), dtype="float32", kv_cache_blocks=64)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, min_new_tokens=10)
        assert output.token_ids == expected[0, len(prompt):].tolist()
