"""Gemma 4 text models: `Gemma4ForCausalLM` and the language model of `Gemma4ForConditionalGeneration`.

Gemma 3's blocks (gpu/models/gemma.py) with what Gemma 4 adds, read from transformers' modeling_gemma4.py:
- norms that scale by w itself (GEMMA4_NORM), also on the values (without a weight), and scores not scaled
  (scale 1: the q/k norms set their size);
- full-attention layers with their own head size and KV heads (`per_layer_config`), a partial rotation
  (`proportional` RoPE), and, with `attention_k_eq_v`, values that are the keys before their norm;
- per-layer inputs (PLE): a second embedding of every token, one slice per layer, mixed with a projection of the
  embedded input, feeding a gated residual branch after each block's MLP;
- each block's output scaled by its learned `layer_scalar`;
- KV sharing: the last `num_kv_shared_layers` layers compute no keys or values and read those of the last earlier
  layer of their type (that layer's cache: they own none); with `use_double_wide_mlp` their MLP is twice as wide.
A block here ends with its residual sum done (the scalar multiplies the whole stream). The MoE blocks of the
larger Gemma 4 models (`enable_moe_block`) are not served by this file.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.attention import AttentionSpec
from gpu.layers.linear import Linear
from gpu.layers.mlp import MLPSpec
from gpu.layers.norm import GEMMA4_NORM, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import VocabParallelEmbedding
from gpu.models.causal_lm import CausalLM
from gpu.models.gemma import GemmaBlockSpec, GemmaDecoderLayer, GemmaModel, language_model_name
from gpu.models.llama import sliding_window_of


def reuses_kv(config: PretrainedConfig, layer_index: int) -> bool:
    """Whether the layer reads the keys and values of an earlier layer of its type: the last
    `num_kv_shared_layers` layers do (transformers 5.17's config says only that; later ones list it per layer)."""
    modes = getattr(config, "kv_sharing_modes", None)
    if modes is not None:
        return modes[layer_index] == "reuse"
    return layer_index >= config.num_hidden_layers - config.num_kv_shared_layers and config.num_kv_shared_layers > 0


def gemma4_block_spec(config: PretrainedConfig, layer_index: int) -> GemmaBlockSpec:
    if getattr(config, "enable_moe_block", False):
        raise ValueError("Gemma 4 with MoE blocks (enable_moe_block) is not supported")
    layer = config.per_layer_config[layer_index]  # the full-attention layers' own head size and KV heads
    is_shared = reuses_kv(config, layer_index)
    is_sliding = config.layer_types[layer_index] == "sliding_attention"
    bias = bool(config.attention_bias)
    attention = AttentionSpec(
        hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        num_kv_heads=layer.num_key_value_heads, head_dim=layer.head_dim, scale=1.0, norm_eps=config.rms_norm_eps,
        qkv_bias=bias, o_bias=bias, qk_norm=GEMMA4_NORM, has_value_norm=True,
        values_are_keys=bool(config.attention_k_eq_v) and not is_sliding, computes_kv=not is_shared,
        sliding_window=sliding_window_of(config, layer_index),
    )
    width = 2 if config.use_double_wide_mlp and is_shared else 1
    mlp = MLPSpec(config.hidden_size, config.intermediate_size * width, config.hidden_activation)
    return GemmaBlockSpec(attention, mlp, GEMMA4_NORM, config.layer_types[layer_index])


class Gemma4DecoderLayer(GemmaDecoderLayer):
    def __init__(self, spec: GemmaBlockSpec, rotary: RotaryEmbedding, per_layer_size: int, kernels: KernelConfig,
                 tp: TensorParallel) -> None:
        super().__init__(spec, rotary, kernels, tp)
        hidden, eps = spec.attention.hidden_size, spec.attention.norm_eps
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.has_per_layer_input = per_layer_size > 0
        if self.has_per_layer_input:
            self.per_layer_input_gate = Linear(hidden, per_layer_size, False, kernels)
            self.per_layer_projection = Linear(per_layer_size, hidden, False, kernels)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps, kernels, spec.norm)

    def forward(  # type: ignore[override]
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata,
        per_layer_input: torch.Tensor | None = None,  # [num_tokens, per_layer_size]
    ) -> tuple[torch.Tensor, None]:
        """(the block's output, None): the residual stream is summed here."""
        out, residual = super().forward(positions, hidden, residual, meta)
        hidden = residual + out
        if per_layer_input is not None:
            gated = F.gelu(self.per_layer_input_gate(hidden), approximate="tanh") * per_layer_input
            hidden = hidden + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return hidden * self.layer_scalar, None


class Gemma4Model(GemmaModel):
    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        self.per_layer_size = config.hidden_size_per_layer_input or 0
        specs = [gemma4_block_spec(config, i) for i in range(config.num_hidden_layers)]
        super().__init__(config, specs, max_position, kernels, tp)
        self.projection_scale = config.hidden_size**-0.5
        if self.per_layer_size:
            size = config.num_hidden_layers * self.per_layer_size
            self.embed_tokens_per_layer = VocabParallelEmbedding(config.vocab_size_per_layer_input, size, tp)
            self.register_buffer("per_layer_embed_scale", torch.tensor(self.per_layer_size**0.5), persistent=False)
            self.per_layer_model_projection = Linear(config.hidden_size, size, False, kernels)
            self.per_layer_projection_norm = RMSNorm(self.per_layer_size, config.rms_norm_eps, kernels, GEMMA4_NORM)
        self._share_kv(config)

    def build_layer(self, index: int, spec: GemmaBlockSpec, rotary: RotaryEmbedding, kernels: KernelConfig,
                    tp: TensorParallel) -> nn.Module:
        return Gemma4DecoderLayer(spec, rotary, self.per_layer_size, kernels, tp)

    def _share_kv(self, config: PretrainedConfig) -> None:
        """Each layer that computes no K/V reads the cache of the last earlier layer of its type that does."""
        first_shared = config.num_hidden_layers - config.num_kv_shared_layers
        for i in range(first_shared, config.num_hidden_layers):
            source = max(j for j in range(first_shared) if config.layer_types[j] == config.layer_types[i])
            self.layers[i].self_attn.read_kv_of(self.layers[source].self_attn)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed(input_ids)
        per_layer = self._per_layer_inputs(input_ids, hidden) if self.per_layer_size else None
        residual = None
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, residual, meta, per_layer[:, i] if per_layer is not None
                                     else None)
        hidden, _ = self.norm.forward_with_residual(hidden, residual)
        return hidden

    def _per_layer_inputs(self, input_ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """[num_tokens, num_layers, per_layer_size]: (norm(projection of the embedded input) + the tokens' own
        per-layer embedding) / sqrt(2), as transformers' project_per_layer_inputs."""
        shape = (input_ids.shape[0], len(self.layers), self.per_layer_size)
        tokens = (self.embed_tokens_per_layer(input_ids) * self.per_layer_embed_scale).reshape(shape)
        projected = self.per_layer_model_projection(embedded) * self.projection_scale
        projected = self.per_layer_projection_norm(projected.reshape(shape))
        return (projected + tokens) * 2.0**-0.5


class Gemma4ForCausalLM(CausalLM):
    def build_decoder(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig,
                      tp: TensorParallel) -> nn.Module:
        return Gemma4Model(config, max_position, kernels, tp)

    def checkpoint_name(self, name: str) -> str | None:
        """Checkpoints may keep K/V projections and norms for the layers that share KV: they are not used."""
        parts = name.split(".")
        if (len(parts) > 4 and parts[:2] == ["model", "layers"] and parts[3] == "self_attn"
                and parts[4] in ("k_proj", "v_proj", "k_norm", "v_norm")
                and not self.model.layers[int(parts[2])].self_attn.owns_kv_cache):
            return None
        return name


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """The language model of Gemma 4's multimodal checkpoints (their vision and audio towers left out)."""

    def checkpoint_name(self, name: str) -> str | None:
        text_name = language_model_name(name)
        return None if text_name is None else super().checkpoint_name(text_name)
