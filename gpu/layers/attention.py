"""The attention layer of a decoder block: project, rotate, write K/V to the cache, attend.

The layer owns no cache: the runner hands it this layer's (k_cache, v_cache) after allocating them.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.backend import AttentionBackend
from gpu.attention.metadata import AttentionMetadata
from gpu.layers.linear import MergedLinear
from gpu.layers.norm import RMSNorm
from gpu.layers.rotary import RotaryEmbedding


class DecoderAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding, has_qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        has_bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": q_size, "k": kv_size, "v": kv_size}, has_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=bool(getattr(config, "attention_bias", False)))
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.rotary = rotary
        self.backend: AttentionBackend | None = None
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        assert self.backend is not None, "the runner sets the backend before the first forward"
        self.backend.store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        out = self.backend.forward(q, self.k_cache, self.v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, -1))
