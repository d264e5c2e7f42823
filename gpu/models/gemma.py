"""Gemma 3: `Gemma3ForCausalLM`, and the language model of `Gemma3ForConditionalGeneration` (its vision tower left
out of loading, with a log line). What makes a Gemma block, beside the Llama one (gpu/models/llama.py):
- RMSNorm scaling by (1 + w) in float32 (gpu/layers/norm.py's GEMMA3_NORM), on the hidden states and on each
  head's query and key;
- "sandwich" norms: the attention's and the MLP's outputs are normed before they join the residual stream
  (post_attention_layernorm, post_feedforward_layernorm), the MLP's input by pre_feedforward_layernorm;
- the embedding scaled by sqrt(hidden_size), rounded to the model dtype as transformers rounds it;
- a GELU-tanh gated MLP (`hidden_activation`);
- the scores scaled by query_pre_attn_scalar^-0.5; layers typed by `layer_types`: sliding layers attend within
  `sliding_window` and rotate with their own RoPE base (`rope_parameters` per layer type), full layers with theirs;
- the final logits soft-capped where the config sets `final_logit_softcapping` (Gemma3ForCausalLM).
As transformers' Gemma 3 (the reference), we do not apply the config's `attn_logit_softcapping` (a Gemma 2 field,
null in every released Gemma 3 config), nor the final soft-cap of the image-text model: either set is logged.
Gemma 4 builds on these blocks (gpu/models/gemma4.py).

The block keeps the residual stream apart from the block outputs, as the Llama decoder does: a block returns its
normed MLP output and the stream before it, and the next block's input norm adds the two (in one kernel on CUDA).
On CUDA the norms (either convention), the q/k norm + RoPE and the GELU-tanh-and-mul run as the Triton kernels
the Llama decoder uses; the skinny GEMM's norm and SiLU prologues (Llama's convention only) do not apply here.
"""

import logging
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.attention import AttentionSpec, DecoderAttention
from gpu.layers.mlp import MLP, MLPSpec
from gpu.layers.norm import GEMMA3_NORM, NormConvention, NormInput, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import VocabParallelEmbedding
from gpu.models.causal_lm import CausalLM, DecoderStack
from gpu.models.llama import sliding_window_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GemmaBlockSpec:
    attention: AttentionSpec
    mlp: MLPSpec
    norm: NormConvention
    layer_type: str  # the type whose RoPE it rotates with: sliding_attention or full_attention


def gemma3_block_spec(config: PretrainedConfig, layer_index: int) -> GemmaBlockSpec:
    bias = bool(config.attention_bias)
    attention = AttentionSpec(
        hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim, scale=config.query_pre_attn_scalar**-0.5,
        norm_eps=config.rms_norm_eps, qkv_bias=bias, o_bias=bias, qk_norm=GEMMA3_NORM,
        sliding_window=sliding_window_of(config, layer_index),
    )
    mlp = MLPSpec(config.hidden_size, config.intermediate_size, config.hidden_activation)
    return GemmaBlockSpec(attention, mlp, GEMMA3_NORM, config.layer_types[layer_index])


class GemmaDecoderLayer(nn.Module):
    def __init__(self, spec: GemmaBlockSpec, rotary: RotaryEmbedding, kernels: KernelConfig,
                 tp: TensorParallel) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(spec.attention, rotary, kernels, tp)
        self.mlp = MLP(spec.mlp, kernels, tp)
        hidden, eps = spec.attention.hidden_size, spec.attention.norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, kernels, spec.norm)
        self.post_attention_layernorm = RMSNorm(hidden, eps, kernels, spec.norm)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, kernels, spec.norm)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, kernels, spec.norm)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the block's normed MLP output, the residual stream before it): their sum is the block's output."""
        attended, residual = self.self_attn(positions, NormInput(self.input_layernorm, hidden, residual), meta)
        attended = self.post_attention_layernorm(attended)
        mlp_out, residual = self.mlp(NormInput(self.pre_feedforward_layernorm, attended, residual))
        return self.post_feedforward_layernorm(mlp_out), residual


class GemmaModel(DecoderStack):
    """Scaled embedding, Gemma blocks (their RoPE tables one per layer type), the final norm."""

    def __init__(self, config: PretrainedConfig, specs: list[GemmaBlockSpec], max_position: int,
                 kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        if getattr(config, "use_bidirectional_attention", None):
            raise ValueError("Gemma with bidirectional attention (an embedding model) is not supported")
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        # A buffer, so the model's dtype rounds it as transformers rounds its embed_scale.
        self.register_buffer("embed_scale", torch.tensor(config.hidden_size**0.5), persistent=False)
        head_dims = {spec.layer_type: spec.attention.head_dim for spec in specs}
        rotaries = {kind: RotaryEmbedding(config, dim, max_position, kind) for kind, dim in head_dims.items()}
        self.layers = nn.ModuleList(self.build_layer(i, spec, rotaries[spec.layer_type], kernels, tp)
                                    for i, spec in enumerate(specs))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels, specs[0].norm)

    def build_layer(self, index: int, spec: GemmaBlockSpec, rotary: RotaryEmbedding, kernels: KernelConfig,
                    tp: TensorParallel) -> nn.Module:
        return GemmaDecoderLayer(spec, rotary, kernels, tp)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale


class Gemma3ForCausalLM(CausalLM):
    def build_decoder(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig,
                      tp: TensorParallel) -> nn.Module:
        if config.attn_logit_softcapping is not None:
            logger.warning("attn_logit_softcapping=%s is not applied: transformers' Gemma 3 does not apply it",
                           config.attn_logit_softcapping)
        specs = [gemma3_block_spec(config, i) for i in range(config.num_hidden_layers)]
        return GemmaModel(config, specs, max_position, kernels, tp)


# Where a multimodal checkpoint keeps its language model: transformers 5 writes the first, earlier ones the rest.
LANGUAGE_MODEL_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                           "language_model.lm_head.": "lm_head."}


def language_model_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text model's, or None for the other towers' tensors."""
    if name.startswith("lm_head."):
        return name
    for prefix, ours in LANGUAGE_MODEL_PREFIXES.items():
        if name.startswith(prefix):
            return ours + name.removeprefix(prefix)
    return None


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The language model of Gemma 3's image-text checkpoints (config: its text_config, gpu/model_info.py), whose
    logits transformers does not soft-cap."""

    soft_caps_logits = False

    def build_decoder(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig,
                      tp: TensorParallel) -> nn.Module:
        if config.final_logit_softcapping is not None:
            logger.warning("final_logit_softcapping=%s is not applied: transformers' Gemma 3 image-text model does "
                           "not apply it", config.final_logit_softcapping)
        return super().build_decoder(config, max_position, kernels, tp)

    def checkpoint_name(self, name: str) -> str | None:
        return language_model_name(name)
