"""A GGUF's tensors as a Hugging Face checkpoint's: renamed, dequantized (or kept in their blocks), and un-permuted.

With `keep_blocks` a projection whose block type gpu/quant/gguf.py serves stays in its blocks, as `<module>.qweight`
uint8 [rows, row bytes], and `block_types` names each one's type for config.json; everything else is dequantized.

Dequantization is the `gguf` package's own (`gguf.quants.dequantize`, every type llama.cpp writes:
Q4_0, Q4_1, Q5_0, Q8_0, the K-quants Q4_K, Q5_K, Q6_K ...).
llama.cpp's converter reorders the rows of a Llama model's Q and K projections so that its RoPE
rotates adjacent pairs; transformers (and our models) rotate halves, so for the `llama`
architecture those rows are put back, exactly inverting llama.cpp's `permute`. Qwen2/Qwen3 and Gemma 3
files are written unpermuted (their RoPE already rotates halves in llama.cpp).

Gemma 3: llama.cpp's converter stores every norm weight w as 1 + w (its RMSNorm multiplies by the stored weight;
transformers' adds 1 to w), so 1 is subtracted again here, in float32 as transformers' GGUF loader subtracts it;
and its block norms have names of their own (`post_attention_norm`, `ffn_norm` before the MLP, `post_ffw_norm`).
"""

from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from core.model_files.errors import ModelUnavailable
from gpu.quant.gguf_blocks import TYPES as KEPT_TYPES

_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_IN_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


_GEMMA3_IN_BLOCK = {**_IN_BLOCK, "post_attention_norm": "post_attention_layernorm",
                    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_NORM_SHIFTS = {"gemma3": 1.0}  # what llama.cpp adds to a family's norm weights


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    parts = gguf_name.split(".")
    in_block = _GEMMA3_IN_BLOCK if arch == "gemma3" else _IN_BLOCK
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in in_block:
        return f"model.layers.{parts[1]}.{in_block[parts[2]]}.{parts[3]}"
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


_PROJECTIONS = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}


def is_kept_in_blocks(tensor: ReaderTensor) -> bool:
    """A projection weight of a block type the GPU kernels read."""
    parts = tensor.name.split(".")
    return (parts[0] == "blk" and len(parts) == 4 and parts[2] in _PROJECTIONS and parts[3] == "weight"
            and tensor.tensor_type.name in KEPT_TYPES)


def block_types(reader: GGUFReader, arch: str) -> dict[str, str]:
    """Checkpoint module name -> block type of every tensor `iter_hf_tensors` keeps in blocks."""
    return {hf_name(t.name, arch).removesuffix(".weight"): t.tensor_type.name for t in reader.tensors
            if is_kept_in_blocks(t)}


def iter_hf_tensors(reader: GGUFReader, config: dict[str, object], arch: str, dtype: torch.dtype,
                    keep_blocks: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers name, tensor in `dtype`, or uint8 blocks) for each tensor of the file, in file order."""
    permute_heads: dict[str, int] = {}
    if arch == "llama":
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        permute_heads = {"attn_q": int(heads), "attn_k": int(kv_heads)}  # type: ignore[call-overload]
    norm_shift = _NORM_SHIFTS.get(arch, 0.0)
    for tensor in reader.tensors:
        is_blocks = keep_blocks and is_kept_in_blocks(tensor)
        weight = tensor.data if is_blocks else dequantized(tensor)  # blocks: [rows, row bytes], rows whole
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else None
        if kind in permute_heads:
            weight = unpermute_rows(weight, permute_heads[kind])
        if norm_shift and tensor.name.endswith("norm.weight"):
            weight = weight.astype(np.float32) - np.float32(norm_shift)
        if not weight.flags.writeable:  # a view of the read-only mapped file
            weight = weight.copy()
        name = hf_name(tensor.name, arch)
        tensor_out = torch.from_numpy(np.ascontiguousarray(weight))
        yield (name.removesuffix(".weight") + ".qweight", tensor_out) if is_blocks else (name, tensor_out.to(dtype))
