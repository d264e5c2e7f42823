"""GGUF -> checkpoint directory, on a small GGUF the test writes with the `gguf` package.

Oracles: gguf's own dequantization of each tensor (with llama.cpp's Q/K permutation undone), the
original weights where the file kept them unquantized, transformers' own GGUF loader (same tensors,
same greedy tokens as our engine), and the original tokenizer (same token ids).
"""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from core.model_files import ModelNotFound, ModelUnavailable, resolve_model
from core.model_files.gguf_checkpoint import gguf_checkpoint
from tests.gguf_files import assert_transformers_gguf_loader_agrees, gguf_name, write_llama_gguf

TEXTS = ["Hello! How are you today?", "The capital of France is Paris.", "1 2 3 100 3.14159", "café 你好 🙂",
         "<|im_start|>user\nHi<|im_end|>\n"]


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dirs: dict[str, Path]) -> Path:
    return tiny_model_dirs["llama"]  # untied embeddings, 4 query heads over 1 KV head


@pytest.fixture(scope="module")
def gguf_path(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(llama_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def converted(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf_checkpoint(gguf_path, tmp_path_factory.mktemp("cache"), "float32")


def test_tensors_equal_ggufs_own_dequantization(llama_dir: Path, gguf_path: Path, converted: Path) -> None:
    ours = load_file(str(next(converted.glob("*.safetensors"))))
    original = load_file(str(llama_dir / "model.safetensors"))
    config = json.loads((llama_dir / "config.json").read_text())
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    file_tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    assert set(ours) == set(original)
    for name, weight in ours.items():
        tensor = file_tensors[gguf_name(name)]
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        kind = _kind(gguf_name(name))
        if kind in heads:  # llama.cpp's row order, put back into transformers'
            expected = _unpermute(expected, heads[kind])
        assert torch.equal(weight, torch.from_numpy(np.array(expected)).float()), name
        # Against the weights the file was written from: exact where the file kept float32, else within the
        # quantization's error (rows in the wrong order would be off by the weights' whole spread, about 1).
        tolerance = {"Q8_0": 0.01, "Q4_1": 0.06, "F16": 1e-3, "F32": 0.0}[tensor.tensor_type.name]
        assert (weight - original[name]).abs().max() <= tolerance, name
    assert {t.tensor_type.name for t in file_tensors.values()} == {"Q8_0", "Q4_1", "F16", "F32"}


def _kind(gguf_tensor_name: str) -> str:
    parts = gguf_tensor_name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Written out here independently of core/model_files/gguf_weights.py, from llama.cpp's permute."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def test_config_and_tokenizer_come_from_the_metadata(llama_dir: Path, converted: Path) -> None:
    from transformers import AutoTokenizer

    config, original = (json.loads((d / "config.json").read_text()) for d in (converted, llama_dir))
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings", "architectures"):
        assert config[key] == original[key], key
    ours, theirs = AutoTokenizer.from_pretrained(converted), AutoTokenizer.from_pretrained(llama_dir)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    messages = [{"role": "user", "content": "Hello!"}]
    assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [theirs.convert_tokens_to_ids("<|im_end|>"),
                                          theirs.convert_tokens_to_ids("<|endoftext|>")]


def test_transformers_gguf_loader_agrees(gguf_path: Path, converted: Path) -> None:
    assert_transformers_gguf_loader_agrees(gguf_path, converted, [[5, 17, 99, 300, 42], [7] * 20, list(range(3, 40))])


def test_converted_once_then_loaded_from_the_cache(gguf_path: Path, tmp_path: Path) -> None:
    first = gguf_checkpoint(gguf_path, tmp_path, "float32")
    stamp = (first / "config.json").stat().st_mtime_ns
    assert gguf_checkpoint(gguf_path, tmp_path, "float32") == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
    half = gguf_checkpoint(gguf_path, tmp_path, "bfloat16")
    assert half != first and json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert {p.name for p in (tmp_path / "gguf").iterdir()} == {first.name, half.name}  # no scratch left over


def test_model_flag_takes_a_gguf_file_or_a_directory_holding_one(gguf_path: Path, tmp_path: Path) -> None:
    by_file = resolve_model(str(gguf_path), "float32", "cpu", tmp_path)
    by_dir = resolve_model(str(gguf_path.parent), "float32", "cpu", tmp_path)
    assert by_file.path == by_dir.path and (by_file.path / "config.json").is_file()
    assert by_file.name == str(gguf_path)


@pytest.mark.parametrize("damage", ["not_gguf", "truncated", "bad_header"])
def test_a_damaged_gguf_is_a_clear_error(gguf_path: Path, tmp_path: Path, damage: str) -> None:
    data = gguf_path.read_bytes()
    damaged = {"not_gguf": b"PK\x03\x04" + data[4:], "truncated": data[: len(data) * 2 // 3],
               "bad_header": data[:8] + b"\xff" * 16 + data[24:]}[damage]
    path = tmp_path / "model.gguf"
    path.write_bytes(damaged)
    with pytest.raises(ModelUnavailable, match=r"model\.gguf (is not a GGUF|is a damaged|is truncated)"):
        resolve_model(str(path), "float32", "cpu", tmp_path / "cache")
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


@pytest.mark.parametrize("missing", ["/no/such/model", "./models/x", "~/x.gguf", "missing.gguf", "a/b/c"])
def test_a_path_that_does_not_exist_says_so(missing: str, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no such file or directory"):
        resolve_model(missing, "float32", "cpu", tmp_path)


def test_sampling_values_go_into_a_new_copy_and_into_one_converted_before(gguf_path: Path, tmp_path: Path) -> None:
    recommended = {"temperature": 0.2, "top_p": 0.9}
    fresh = gguf_checkpoint(gguf_path, tmp_path / "new", "float32", sampling=recommended)
    written = json.loads((fresh / "generation_config.json").read_text())
    assert (written["temperature"], written["top_p"], written["do_sample"]) == (0.2, 0.9, True)
    older = gguf_checkpoint(gguf_path, tmp_path / "old", "float32")  # as a version that wrote no sampling values
    before = json.loads((older / "generation_config.json").read_text())
    assert "temperature" not in before
    assert gguf_checkpoint(gguf_path, tmp_path / "old", "float32", sampling=recommended) == older
    after = json.loads((older / "generation_config.json").read_text())
    assert after == before | recommended | {"do_sample": True}  # eos and bos ids kept
    assert sorted(p.name for p in older.iterdir()) == sorted(p.name for p in fresh.iterdir())  # no scratch file
