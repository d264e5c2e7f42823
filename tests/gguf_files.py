"""Writes GGUF files for tests with the `gguf` package, as llama.cpp's converter would write them.

From a tiny transformers Llama checkpoint: llama.cpp's tensor names, its row permutation of Q and K,
its metadata keys, the tokenizer as tokens + merges + token types, and the chosen tensors quantized
with `gguf.quants.quantize` (Q8_0, Q4_1 ...). From a tiny Gemma 3 checkpoint likewise, with Gemma's block norm
names and llama.cpp's +1 on every norm weight (its `norm_shift`), Q and K unpermuted. Nothing here is read back by
our own code.
"""

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType
from safetensors.numpy import load_file

_BLOCK = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
_GEMMA3_BLOCK = {**_BLOCK, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                 "post_feedforward_layernorm": "post_ffw_norm", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm"}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}

# What the tests quantize: both kinds llama.cpp uses for SmolLM2's file, on permuted and plain tensors.
QUANTIZED = {"token_embd": GGMLQuantizationType.Q8_0, "attn_q": GGMLQuantizationType.Q8_0,
             "attn_k": GGMLQuantizationType.Q4_1, "ffn_gate": GGMLQuantizationType.Q4_1,
             "ffn_down": GGMLQuantizationType.Q4_1, "output": GGMLQuantizationType.F16}


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    stem, suffix = hf_name.rsplit(".", 1)
    if stem.startswith("model.layers."):
        _, _, layer, module = stem.split(".", 3)
        return f"blk.{layer}.{(_GEMMA3_BLOCK if arch == 'gemma3' else _BLOCK)[module]}.{suffix}"
    return f"{_TOP[stem]}.{suffix}"


def permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute, as written there."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


BlockMaker = Callable[[int, int, GGMLQuantizationType, int], np.ndarray]


def write_llama_gguf(model_dir: Path, path: Path, quantized: dict[str, GGMLQuantizationType] = QUANTIZED,
                     arch: str = "llama", blocks: BlockMaker | None = None) -> Path:
    """`blocks` (rows, columns, type, seed) -> [rows, row bytes]: makes the blocks of the types gguf cannot
    quantize (the K-quants), in place of the weights."""
    config = json.loads((model_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hyperparameters(writer, config, arch)
    _write_tokenizer(writer, model_dir)
    for hf_name, weight in load_file(str(model_dir / "model.safetensors")).items():
        name = gguf_name(hf_name, arch)
        kind = name.split(".")[2] if name.startswith("blk.") else name.split(".")[0]
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            weight = weight + np.float32(1.0)  # llama.cpp's norm_shift for Gemma 3
        elif arch == "llama" and kind == "attn_q":
            weight = permute(weight, config["num_attention_heads"])
        elif arch == "llama" and kind == "attn_k":
            weight = permute(weight, config["num_key_value_heads"])
        quant = quantized.get(kind, GGMLQuantizationType.F32)
        if blocks is not None and quant.name.endswith("_K"):
            data = blocks(*weight.shape, quant, len(name))
        else:
            data = gguf.quants.quantize(weight.astype(np.float32), quant)
        writer.add_tensor(name, data, raw_shape=data.shape if quant in _PLAIN else None, raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_PLAIN = (GGMLQuantizationType.F32, GGMLQuantizationType.F16)


def _write_hyperparameters(writer: gguf.GGUFWriter, config: dict, arch: str) -> None:
    writer.add_name(f"tiny test {arch}")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if arch == "gemma3":
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
        writer.add_sliding_window(config["sliding_window"])
        writer.add_rope_freq_base(config["rope_parameters"]["full_attention"]["rope_theta"])
    else:
        writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])


def _write_tokenizer(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = dict(tokenizer["model"]["vocab"])
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    vocab.update(specials)
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]])
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    writer.add_eos_token_id(vocab[tokenizer_config["eos_token"]])
    writer.add_pad_token_id(vocab[tokenizer_config["pad_token"]])
    writer.add_add_bos_token(False)
    template = model_dir / "chat_template.jinja"
    writer.add_chat_template(template.read_text() if template.exists() else tokenizer_config["chat_template"])


def assert_transformers_gguf_loader_agrees(gguf_path: Path, converted: Path, prompts: list[list[int]]) -> None:
    """transformers' own GGUF loader (the oracle) reads the tensors we converted, and its greedy tokens are ours."""
    from safetensors.torch import load_file as load_torch
    from transformers import AutoModelForCausalLM

    from core import LLM, SamplingParams

    hf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
    ours = load_torch(str(next(converted.glob("*.safetensors"))))
    is_tied = "lm_head.weight" not in ours
    for name, weight in hf.state_dict().items():
        if not (is_tied and name == "lm_head.weight"):
            assert torch.equal(weight, ours[name]), name
    llm = LLM(str(converted), dtype="float32", kv_cache_blocks=64)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, min_new_tokens=10)
        assert output.token_ids == expected[0, len(prompt):].tolist()
