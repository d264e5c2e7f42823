"""How a layer's fused QKV projection holds its heads and how its queries and keys are made from them: what a decode
kernel that starts from the raw projection (gpu/kernels/fused_decode_attention.py) needs of the layer besides the
step's tensors. Plain data, so the backend interface can name it without importing a kernel."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QkvHeads:
    """qk_norm_rope_store_kv's arguments (gpu/kernels/qk_norm_rope.py) but qkv, the positions and the cache."""

    heads: tuple[int, int, int]  # (num_heads, num_kv_heads, head_dim)
    rotary: tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each [max_position, rotary_dim]
    norm_weights: tuple[torch.Tensor, torch.Tensor] | None  # (q_norm, k_norm), each [head_dim]; None: no norm
    eps: float = 1e-6
    norm_convention: tuple[float, bool] = (0.0, False)  # (weight offset, scales in float32): Llama's by default
    kv_scales: tuple[float, float] = (1.0, 1.0)  # an FP8 cache's (k_scale, v_scale)
    has_output_gate: bool = False  # qkv's queries are [query; gate] per head
