"""Llama-family decoder: Llama 2/3, Qwen2 (q/k/v bias), Qwen3 (per-head q/k norms), Mistral (with or without
`sliding_window`) and Phi-3 (fused `qkv_proj` / `gate_up_proj` checkpoint tensors, partial rotary and longrope),
each from its own config: what differs is read from the config (gpu/layers/rotary.py, `attention_spec`) or from
the checkpoint's names (gpu/loader.py), so a family here is a line of gpu/models/__init__.py.

Parameter names follow the Hugging Face checkpoints, except the merged projections
(`qkv_proj`, `gate_up_proj`), which `packed_modules` maps back to checkpoint names. On CUDA the
elementwise work of a layer (residual add + RMSNorm twice, q/k norm + RoPE, SiLU-and-mul) runs as
four Triton kernels where triton is installed: per decode step a layer launches about a dozen
kernels instead of about sixty, which is what a small batch pays for. A model built with
`KernelConfig.fused_kernels` off runs the torch reference code instead (tests compare the two).

Tensor parallelism (`tp`, one rank of the group): q/k/v and gate/up are column-parallel (each rank
holds its heads' and its share of the MLP's rows), o_proj and down_proj row-parallel (one all-reduce
each), the embedding and LM head split by vocabulary; norms are replicated. Two all-reduces per layer.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.attention import AttentionSpec, DecoderAttention
from gpu.layers.mlp import MLP, MLPSpec
from gpu.layers.norm import LLAMA_NORM, NormConvention, NormInput, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import VocabParallelEmbedding
from gpu.models.causal_lm import CausalLM, DecoderStack

MlpBuilder = Callable[[PretrainedConfig, int, KernelConfig, TensorParallel], nn.Module]


def dense_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    return MLP(mlp_spec(config), kernels, tp)


def mlp_spec(config: PretrainedConfig, intermediate_size: int | None = None) -> MLPSpec:
    """A Llama-family MLP of the config's `intermediate_size` (unless given: an MoE's shared experts)."""
    return MLPSpec(config.hidden_size, intermediate_size or config.intermediate_size,
                   getattr(config, "hidden_act", "silu"), bool(getattr(config, "mlp_bias", False)))


def sliding_window_of(config: PretrainedConfig, layer_index: int) -> int | None:
    """A layer's sliding window, as transformers gives it: with `layer_types`, the window of the layers typed
    `sliding_attention` (Qwen2/Qwen3's `use_sliding_window`, Gemma); without, every layer's (Mistral, Phi-3)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or layer_types is None:
        return window
    return window if layer_types[layer_index] == "sliding_attention" else None


def attention_spec(config: PretrainedConfig, layer_index: int, has_qk_norm: bool) -> AttentionSpec:
    """A Llama-family layer's attention: q/k/v bias where `attention_bias` says (Qwen2 always), o bias likewise."""
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    attention_bias = bool(getattr(config, "attention_bias", False))
    return AttentionSpec(
        hidden_size=config.hidden_size, num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads, head_dim=head_dim,
        scale=head_dim**-0.5, norm_eps=config.rms_norm_eps, qkv_bias=attention_bias or config.model_type == "qwen2",
        o_bias=attention_bias, qk_norm=LLAMA_NORM if has_qk_norm else None,
        sliding_window=sliding_window_of(config, layer_index),
    )


@dataclass(frozen=True)
class Blocks:
    """What a family chooses for its layers: each one's attention, each one's MLP block (dense or sparse), and the
    convention of the block norms (gpt-oss scales in float32: gpu/layers/norm.py)."""

    attention: list[AttentionSpec]
    build_mlp: MlpBuilder = dense_mlp
    norm: NormConvention = LLAMA_NORM


class DecoderLayer(nn.Module):
    def __init__(self, spec: AttentionSpec, rotary: RotaryEmbedding, mlp: nn.Module, norm: NormConvention,
                 kernels: KernelConfig, tp: TensorParallel) -> None:
        """mlp: the block after attention, forward(NormInput) -> (output, residual): dense or sparse (MoE)."""
        super().__init__()
        self.self_attn = DecoderAttention(spec, rotary, kernels, tp)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, kernels, norm)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps, kernels, norm)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Each norm goes into the block after it, whose first product may compute it (gpu/layers/linear.py).
        hidden, residual = self.self_attn(positions, NormInput(self.input_layernorm, hidden, residual), meta)
        return self.mlp(NormInput(self.post_attention_layernorm, hidden, residual))


class DecoderModel(DecoderStack):
    def __init__(self, config: PretrainedConfig, max_position: int, blocks: Blocks, kernels: KernelConfig,
                 tp: TensorParallel) -> None:
        super().__init__()
        specs = blocks.attention
        rotary = RotaryEmbedding(config, specs[0].head_dim, max_position)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, rotary, blocks.build_mlp(config, i, kernels, tp), blocks.norm, kernels, tp)
            for i, spec in enumerate(specs))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels, blocks.norm)


class LlamaForCausalLM(CausalLM):
    """A family is this class with other settings: `has_qk_norm` (or its own `attention_specs`), `build_mlp` (each
    layer's MLP block, dense or sparse), `block_norm`, and the checkpoint's naming (gpu/loader.py: `packed_modules`,
    `expert_parts`, `checkpoint_name`)."""

    has_qk_norm = False
    build_mlp: MlpBuilder = staticmethod(dense_mlp)
    block_norm = LLAMA_NORM

    def build_decoder(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig,
                      tp: TensorParallel) -> nn.Module:
        blocks = Blocks(self.attention_specs(config), self.build_mlp, self.block_norm)
        return DecoderModel(config, max_position, blocks, kernels, tp)

    def attention_specs(self, config: PretrainedConfig) -> list[AttentionSpec]:
        return [attention_spec(config, i, self.has_qk_norm) for i in range(config.num_hidden_layers)]


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: the Llama decoder with an RMSNorm on each head's query and key before RoPE."""

    has_qk_norm = True
