"""Rotary position embedding (the rotate-half form used by Llama, Qwen2 and Qwen3).

The cos/sin table is computed once for every position up to the context length, in float32,
the way transformers computes it, so float32 parity holds to the bit.

Rotating is x * cos + rotate_half(x) * sin, computed as x * cos + swap_halves(x) * signed_sin (a roll by half) with
the first half of signed_sin negated: the same products (a sign flip is exact), in three operations
instead of five (on a CPU each operation's dispatch is what a small step pays for).
"""

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Scalings that depend only on the config; 'dynamic' rescales with the sequence length at run time.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_parameters(config: PretrainedConfig) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def inverse_frequencies(config: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    params = rope_parameters(config)
    rope_type = params["rope_type"]
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported (supported: {STATIC_ROPE_TYPES})")
    if rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, max_position: int) -> None:
        super().__init__()
        inv_freq, scaling = inverse_frequencies(config, head_dim)
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_dim]
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)
        half = head_dim // 2
        signed_sin = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)
        self.register_buffer("signed_sin", signed_sin, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [num_tokens, num_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim]."""
        return self.rotate(positions, q), self.rotate(positions, k)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, num_heads, head_dim] (query and key heads alike)."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        signed_sin = self.signed_sin[positions].unsqueeze(1).to(x.dtype)
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin  # roll by half: the halves swapped
