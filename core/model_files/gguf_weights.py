"""A GGUF's tensors as a Hugging Face checkpoint's: renamed, dequantized, and un-permuted.

Dequantization is the `gguf` package's own (`gguf.quants.dequantize`, every type llama.cpp writes).
llama.cpp's converter reorders the rows of a Llama model's Q and K projections so that its RoPE
rotates adjacent pairs; transformers (and our models) rotate halves, so for the `llama`
architecture those rows are put back, exactly inverting llama.cpp's `permute`. Qwen2/Qwen3 files
are written unpermuted (their RoPE already rotates halves in llama.cpp).
"""

from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from core.model_files.errors import ModelUnavailable

_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_IN_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _IN_BLOCK:
        return f"model.layers.{parts[1]}.{_IN_BLOCK[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_LEVEL:
        return f"{_TOP_LEVEL[parts[0]]}.{parts[1]}"
    raise ModelUnavailable(f"GGUF tensor {gguf_name!r} has no place in the models we serve")


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of llama.cpp's `permute(w, n_head)`: [heads, 2, d/2] rows back from [heads, d/2, 2]."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def dequantized(tensor: ReaderTensor) -> np.ndarray:
    """The tensor as float32 (or its stored float type), shaped [rows, columns] as transformers stores it."""
    try:
        return dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        kind = tensor.tensor_type.name
        raise ModelUnavailable(f"GGUF tensor {tensor.name}: type {kind} cannot be dequantized") from exc


def iter_hf_tensors(reader: GGUFReader, config: dict[str, object],
                    dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers name, tensor in `dtype`) for each tensor of the file, in file order."""
    permute_heads: dict[str, int] = {}
    if config["model_type"] == "llama":
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        permute_heads = {"attn_q": int(heads), "attn_k": int(kv_heads)}  # type: ignore[call-overload]
    for tensor in reader.tensors:
        weight = dequantized(tensor)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else None
        if kind in permute_heads:
            weight = unpermute_rows(weight, permute_heads[kind])
        if not weight.flags.writeable:  # an unquantized tensor is a view of the read-only mapped file
            weight = weight.copy()
        yield hf_name(tensor.name), torch.from_numpy(np.ascontiguousarray(weight)).to(dtype)
