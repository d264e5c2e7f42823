"""GLM-4-MoE (GLM-4.5, GLM-4.5-Air, GLM-4.6): the Llama decoder with GLM's attention (q/k/v biases where
`attention_bias` says but never an o bias, per-head q/k norms where `use_qk_norm` says, the rotation of the first
`partial_rotary_factor` of each head: gpu/layers/rotary.py), whose first `first_k_dense_replace` layers have a
dense MLP and the rest a sparse one: sigmoid scores with a correction bias that only chooses, group-limited top-k
(`n_group`, `topk_group`), renormalized where `norm_topk_prob` says and scaled by `routed_scaling_factor`, the
router in float32; and `n_shared_experts` shared experts on every token.

The checkpoint's multi-token-prediction layers (`num_nextn_predict_layers` of them, numbered after the decoder's) are
left out (a log line counts their tensors), except the first for speculative decoding's method `mtp`
(`build_mtp_head`, `MtpLayer`).
"""

import re
from dataclasses import replace

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.metadata import AttentionMetadata
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.layers.attention import AttentionSpec, DecoderAttention
from gpu.layers.linear import Linear
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.layers.norm import LLAMA_NORM, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import ParallelLMHead
from gpu.models.llama import DecoderLayer, LlamaForCausalLM, attention_spec, dense_mlp

LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")
# The MTP layer's own tensors beside its decoder layer's (whose names go under `mtp_block.`); its `embed_tokens` is
# the target's (left out).
MTP_OWN_PARTS = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")


def glm4_moe_spec(config: PretrainedConfig) -> MoeSpec:
    routing = Routing(config.n_routed_experts, config.num_experts_per_tok, "sigmoid", bool(config.norm_topk_prob),
                      config.n_group, config.topk_group, float(config.routed_scaling_factor),
                      has_correction_bias=True, float32_logits=True)
    return MoeSpec(routing, config.moe_intermediate_size,
                   shared_intermediate_size=config.moe_intermediate_size * config.n_shared_experts)


def glm4_moe_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    if layer_index < config.first_k_dense_replace:
        return dense_mlp(config, layer_index, kernels, tp)
    return SparseMoe(config, glm4_moe_spec(config), kernels, tp)


def glm4_attention_spec(config: PretrainedConfig, layer_index: int) -> AttentionSpec:
    return replace(attention_spec(config, layer_index, bool(getattr(config, "use_qk_norm", False))), o_bias=False)


class MtpLayer(nn.Module):
    """The first multi-token-prediction layer (`model.layers.{num_hidden_layers}.`, as DeepSeek V3's): from the
    target's last hidden state at position p (after its final norm) and the embedding of token p + 1 (zero at position
    0), a hidden state whose logits through its own `shared_head` predict token p + 2:

        h = mtp_block(eh_proj([enorm(embed(t[p + 1])); hnorm(hidden[p])]))    (the sum of its output and residual)
        logits = shared_head.head(shared_head.norm(h))

    run at position p with its own KV cache; a later draft runs it on its own previous h. The embedding is the
    target's."""

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        index, hidden_size, eps = config.num_hidden_layers, config.hidden_size, config.rms_norm_eps
        spec = glm4_attention_spec(config, index)
        rotary = RotaryEmbedding(config, spec.head_dim, max_position)
        self.enorm = RMSNorm(hidden_size, eps, kernels, LLAMA_NORM)
        self.hnorm = RMSNorm(hidden_size, eps, kernels, LLAMA_NORM)
        self.eh_proj = Linear(2 * hidden_size, hidden_size, bias=False, kernels=kernels)
        self.mtp_block = DecoderLayer(spec, rotary, glm4_moe_mlp(config, index, kernels, tp), LLAMA_NORM, kernels, tp)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(hidden_size, eps, kernels, LLAMA_NORM)
        self.shared_head.head = ParallelLMHead(config.vocab_size, hidden_size, tp, kernels)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
                ) -> torch.Tensor:
        embedded = torch.where((positions == 0)[:, None], 0.0, embedded)  # position 0 has no token before it
        mixed = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        out, residual = self.mtp_block(positions, mixed, None, meta)
        return out + residual

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.shared_head.head(self.shared_head.norm(hidden))


class Glm4MoeForCausalLM(LlamaForCausalLM):
    build_mlp = staticmethod(glm4_moe_mlp)
    expert_parts = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        super().__init__(config, max_position, kernels, tp)
        self.mtp: MtpLayer | None = None  # built by build_mtp_head

    @staticmethod
    def mtp_checkpoint_prefix(config: PretrainedConfig) -> str:
        """Where the checkpoint keeps the MTP head's tensors."""
        return f"model.layers.{config.num_hidden_layers}."

    def build_mtp_head(self, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        """Speculative decoding's method `mtp`: the first MTP layer is built, and loaded from the checkpoint."""
        self.mtp = MtpLayer(self.config, max_position, kernels, tp)

    def run_draft_head(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                     meta: AttentionMetadata) -> torch.Tensor:
        """The head's hidden states (what a later draft reads back)."""
        assert self.mtp is not None, "the model was built without its MTP head"
        return self.mtp(self.model.embed(input_ids), hidden, positions, meta)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        assert self.mtp is not None
        return self.mtp.logits(hidden)

    def attention_specs(self, config: PretrainedConfig) -> list[AttentionSpec]:
        return [glm4_attention_spec(config, i) for i in range(config.num_hidden_layers)]

    def attention_layers(self) -> list[DecoderAttention]:
        """The decoder's, then the MTP head's where it is built (its own KV cache, in the same group)."""
        return super().attention_layers() + ([self.mtp.mtp_block.self_attn] if self.mtp is not None else [])

    def checkpoint_name(self, name: str) -> str | None:
        """None for the multi-token-prediction layers' tensors, numbered after the decoder's layers, except the
        first's where the head is built (its embedding is the target's: left out)."""
        match = LAYER_INDEX.match(name)
        if match is None or int(match[1]) < self.config.num_hidden_layers:
            return name
        if self.mtp is None or int(match[1]) != self.config.num_hidden_layers:
            return None
        rest = name[match.end():]
        if rest.startswith("embed_tokens."):
            return None
        return "mtp." + rest if rest.startswith(MTP_OWN_PARTS) else "mtp.mtp_block." + rest
