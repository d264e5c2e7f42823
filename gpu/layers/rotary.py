"""Rotary position embedding (the rotate-half form used by Llama, Qwen2 and Qwen3).

The cos/sin table is computed once for every position up to the context length, in float32,
the way transformers computes it, so float32 parity holds to the bit.
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

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [num_tokens, num_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim]."""
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)
