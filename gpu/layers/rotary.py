"""Rotary position embedding (the rotate-half form used by Llama, Qwen, Mistral, Phi-3 and Gemma).

The cos/sin table is computed once for every position up to the context length, in float32,
the way transformers computes it, so float32 parity holds to the bit. Per family:
- the parameters come from `rope_parameters` (transformers 5) or `rope_scaling`; Gemma keeps one set per
  layer type (`sliding_attention`, `full_attention`), and a layer builds its table from its type's set;
- partial rotary (Phi-3's `partial_rotary_factor`): only the first rotary_dim dimensions of a head turn, the
  rest pass through;
- `longrope` (Phi-3) switches in transformers between its short and long factors with the sequence length seen
  (and recomputes the cache when a sequence crosses `original_max_position_embeddings`). A paged cache cannot
  recompute what it holds, so, as vLLM does, the table uses the long factors when the served context
  (max_position) exceeds the original length, and the short ones otherwise: equal to transformers for every
  sequence that stays within the original length in the second case, and for every one longer in the first.

Rotating is x * cos + rotate_half(x) * sin, computed as x * cos + swap_halves(x) * signed_sin (a roll by half) with
the first half of signed_sin negated: the same products (a sign flip is exact), in three operations
instead of five (on a CPU each operation's dispatch is what a small step pays for).
"""

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Scalings that depend only on the config (and the served context); 'dynamic' rescales with the sequence length at
# run time. 'proportional' is Gemma 4's partial rotation of its full-attention layers (zero frequencies past it).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


def rope_parameters(config: PretrainedConfig, layer_type: str | None = None) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]  # Gemma: a set per layer type
    params = dict(params)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def has_rope_per_layer_type(config: PretrainedConfig) -> bool:
    params = getattr(config, "rope_parameters", None) or {}
    return any(isinstance(value, dict) for value in params.values())


def inverse_frequencies(config: PretrainedConfig, head_dim: int, layer_type: str | None = None,
                        max_position: int | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2], cos/sin scaling) of a layer of type `layer_type`."""
    params = rope_parameters(config, layer_type)
    rope_type = params["rope_type"]
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported (supported: {STATIC_ROPE_TYPES})")
    if rope_type == "default":
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    kwargs: dict[str, object] = {"layer_type": layer_type} if has_rope_per_layer_type(config) else {}
    original = params.get("original_max_position_embeddings")
    if rope_type == "longrope" and original is not None and max_position is not None and max_position > original:
        kwargs["seq_len"] = original + 1  # the long factors
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), **kwargs)
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, max_position: int,
                 layer_type: str | None = None) -> None:
        super().__init__()
        inv_freq, scaling = inverse_frequencies(config, head_dim, layer_type, max_position)
        self.rotary_dim = 2 * inv_freq.shape[0]  # head_dim unless the rotation is partial
        positions = torch.arange(max_position, dtype=torch.float32)
        # transformers' scalings build their frequencies on the CPU; the table lives where the model is built.
        freqs = positions[:, None] * inv_freq.to(positions.device)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_position, rotary_dim]
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)
        half = self.rotary_dim // 2
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
        if self.rotary_dim < x.shape[-1]:  # partial: the dimensions past rotary_dim pass through
            turned = x[..., : self.rotary_dim]
            turned = turned * cos + turned.roll(self.rotary_dim // 2, dims=-1) * signed_sin
            return torch.cat((turned, x[..., self.rotary_dim :]), dim=-1)
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin  # roll by half: the halves swapped
