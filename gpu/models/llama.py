"""Llama-family decoder (Llama 2/3, Qwen2 with its q/k/v bias, Qwen3 through `has_qk_norm`).

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

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.layers.activation import SiluAndMul
from gpu.layers.attention import DecoderAttention
from gpu.layers.linear import MergedLinear, RowSlice
from gpu.layers.norm import NormInput, RMSNorm
from gpu.layers.parallel_linear import RowParallelLinear
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig, kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"activation {config.hidden_act!r} is not supported (only silu)")
        has_bias = bool(getattr(config, "mlp_bias", False))
        size = config.intermediate_size
        rows = RowSlice(*tp.split(size, "the MLP's intermediate size"), total=size)
        self.gate_up_proj = MergedLinear(config.hidden_size, {"gate": rows, "up": rows}, has_bias, kernels)
        self.down_proj = RowParallelLinear(size, config.hidden_size, has_bias, tp, kernels)
        self.act = SiluAndMul(kernels)

    def forward(self, x: NormInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP of norm(x + residual), x + residual)."""
        if self.gate_up_proj.fuses_silu_and_mul(x.x):
            activated, residual = self.gate_up_proj.forward_normed_silu_and_mul(x)
            return self.down_proj(activated), residual
        gate_up, residual = self.gate_up_proj.forward_normed(x)
        return self.down_proj.forward_silu_and_mul(gate_up, self.act), residual


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding, has_qk_norm: bool,
                 kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(config, rotary, has_qk_norm, kernels, tp)
        self.mlp = MLP(config, kernels, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

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


class DecoderModel(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int, has_qk_norm: bool, kernels: KernelConfig,
                 tp: TensorParallel) -> None:
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotary = RotaryEmbedding(config, head_dim, max_position)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            DecoderLayer(config, rotary, has_qk_norm, kernels, tp) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm.forward_with_residual(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    has_qk_norm = False
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, max_position, self.has_qk_norm, kernels, tp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp, kernels)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)  # [num_tokens, hidden_size]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[num_rows, vocab_size] on tensor-parallel rank 0 (the sampling rank); None on the others."""
        return self.lm_head(hidden)

    def compute_logits_into(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """compute_logits written into `out` [num_rows, vocab_size] (single GPU)."""
        return self.lm_head.forward_into(hidden, out)

    def attention_layers(self) -> list[DecoderAttention]:
        return [layer.self_attn for layer in self.model.layers]
