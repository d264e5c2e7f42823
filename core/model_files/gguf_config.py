"""A GGUF's metadata as a Hugging Face config.json for the architectures the engine runs.

llama.cpp names hyperparameters `<arch>.<key>` (`llama.block_count`); they map one to one onto
transformers' config fields. Whatever the engine could not reproduce (a RoPE scaling stored only as
a tensor of frequencies, an architecture we have no model for) is refused here, by name.

Gemma 3 files carry fewer fields than its transformers config has: what they lack takes transformers' defaults
(the layer pattern of five sliding layers to one full one, the local RoPE base), as transformers' own GGUF loader
builds it, except the attention scale, which llama.cpp derives (1/sqrt(head_dim), and 1/sqrt(hidden / heads) for
the 62-layer 27B model) and which we write as `query_pre_attn_scalar` the same way.
"""

from core.model_files.errors import ModelUnavailable

# GGUF `general.architecture` -> the transformers class our gpu/models serve, and its model_type.
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}

# `<arch>.<key>` -> config field; each of these must be present.
_REQUIRED = {
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "context_length": "max_position_embeddings",
}
GEMMA3_27B_LAYERS = 62


def hf_config(metadata: dict[str, object], tensor_names: set[str], vocab_size: int, dtype: str) -> dict[str, object]:
    arch = str(metadata.get("general.architecture"))
    if arch not in ARCHITECTURES:
        raise ModelUnavailable(f"GGUF architecture {arch!r} is not supported; supported: {sorted(ARCHITECTURES)}")
    if "rope_freqs.weight" in tensor_names:
        raise ModelUnavailable("this GGUF scales RoPE by a tensor of frequencies (Llama 3.1 style), not supported")
    class_name, model_type = ARCHITECTURES[arch]
    config: dict[str, object] = {"architectures": [class_name], "model_type": model_type}
    for key, field in _REQUIRED.items():
        if f"{arch}.{key}" not in metadata:
            raise ModelUnavailable(f"the GGUF's metadata lacks {arch}.{key}")
        config[field] = metadata[f"{arch}.{key}"]
    heads = int(config["num_attention_heads"])  # type: ignore[call-overload]
    config["num_key_value_heads"] = metadata.get(f"{arch}.attention.head_count_kv", heads)
    config["head_dim"] = metadata.get(f"{arch}.attention.key_length", int(config["hidden_size"]) // heads)  # type: ignore[call-overload]
    config["rope_theta"] = float(metadata.get(f"{arch}.rope.freq_base", 10000.0))  # type: ignore[arg-type]
    config["rope_scaling"] = _rope_scaling(metadata, arch)
    config["vocab_size"] = vocab_size
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    config["bos_token_id"] = metadata.get("tokenizer.ggml.bos_token_id")
    config["eos_token_id"] = metadata.get("tokenizer.ggml.eos_token_id")
    config["dtype"] = dtype
    config.update(_gemma3_fields(metadata, config) if arch == "gemma3" else {"hidden_act": "silu"})
    return config


def _gemma3_fields(metadata: dict[str, object], config: dict[str, object]) -> dict[str, object]:
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])  # type: ignore[call-overload]
    head_dim, hidden = int(config["head_dim"]), int(config["hidden_size"])  # type: ignore[call-overload]
    fields: dict[str, object] = {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": hidden // heads if layers == GEMMA3_27B_LAYERS else head_dim,
        "sliding_window": metadata.get("gemma3.attention.sliding_window"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
    }
    if "gemma3.final_logit_softcapping" in metadata:
        fields["final_logit_softcapping"] = float(metadata["gemma3.final_logit_softcapping"])  # type: ignore[arg-type]
    return {name: value for name, value in fields.items() if value is not None}


def _rope_scaling(metadata: dict[str, object], arch: str) -> dict[str, object] | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(metadata[f"{arch}.rope.scaling.factor"])}  # type: ignore[arg-type]
    raise ModelUnavailable(f"GGUF RoPE scaling {kind!r} is not supported (none or linear)")
