"""Qwen3-Next, Qwen3.5 (dense) and Qwen3.5-MoE: hybrids of Gated DeltaNet layers (gpu/layers/gated_deltanet.py) and
gated full-attention layers, by the config's `layer_types` (`linear_attention`, `full_attention`).

- Full attention: per-head q/k norms, partial rotary (`partial_rotary_factor`), and an output gate (q_proj's rows
  are [query; gate] per head: the output is multiplied by sigmoid(gate) before o_proj).
- Every norm scales by (1 + w) in float32, as Gemma 3's (GEMMA3_NORM), except the DeltaNet's gated output norm.
- MLP: Qwen3-Next sparse on every `decoder_sparse_step`-th layer outside `mlp_only_layers` (as Qwen3-MoE),
  Qwen3.5-MoE sparse on every layer, Qwen3.5 dense; the sparse block softmax-routes the top k (renormalized where
  `norm_topk_prob` says; Qwen3.5-MoE always) and adds a shared expert scaled by sigmoid(shared_expert_gate(x)).
- Qwen3.5's image-text checkpoints (`...ForConditionalGeneration`) keep the language model under
  `model.language_model.`; its vision tower (`model.visual.`) is left out.
- The multi-token-prediction head (`mtp.`, `MtpHead`) is built and loaded only for speculative decoding's method
  `mtp` (`build_mtp_head`); otherwise it is left out (the loader's log line counts its tensors).

Text positions only: Qwen3.5's multimodal rotary sections all read the one position of a text token, which is
plain rotary.
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
from gpu.layers.gated_deltanet import DeltaNetSpec, GatedDeltaNet
from gpu.layers.linear import Linear
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.layers.norm import GEMMA3_NORM, NormInput, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.layers.vocab_parallel import VocabParallelEmbedding
from gpu.models.causal_lm import CausalLM, DecoderStack
from gpu.models.llama import attention_spec, dense_mlp

LEFT_OUT = re.compile(r"^(mtp\.|model\.visual\.)")
MTP_PREFIX = "mtp."


def is_linear_layer(config: PretrainedConfig, layer_index: int) -> bool:
    return config.layer_types[layer_index] == "linear_attention"


def gated_attention_spec(config: PretrainedConfig, layer_index: int) -> AttentionSpec:
    spec = attention_spec(config, layer_index, has_qk_norm=True)
    return replace(spec, qk_norm=GEMMA3_NORM, has_output_gate=True, sliding_window=None)


def hybrid_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    """The sparse block where the family has one at this layer (Qwen3-Next's rule, Qwen3.5-MoE's every layer)."""
    num_experts = getattr(config, "num_experts", 0)
    step = getattr(config, "decoder_sparse_step", 1)
    if not num_experts or layer_index in (getattr(config, "mlp_only_layers", None) or []) \
            or (layer_index + 1) % step:
        return dense_mlp(config, layer_index, kernels, tp)
    renormalize = bool(getattr(config, "norm_topk_prob", True))  # Qwen3.5-MoE has no setting: always
    routing = Routing(num_experts, config.num_experts_per_tok, renormalize=renormalize)
    spec = MoeSpec(routing, config.moe_intermediate_size,
                   shared_intermediate_size=config.shared_expert_intermediate_size, has_shared_expert_gate=True)
    return SparseMoe(config, spec, kernels, tp)


class HybridDecoderLayer(nn.Module):
    """A token mixer (`linear_attn` or `self_attn`), then the MLP block, each after its norm."""

    def __init__(self, config: PretrainedConfig, layer_index: int, rotary: RotaryEmbedding, kernels: KernelConfig,
                 tp: TensorParallel, is_linear: bool | None = None) -> None:
        """`is_linear`: the token mixer, where not the config's `layer_types` at `layer_index` (the MTP head's
        layer is full attention)."""
        super().__init__()
        is_linear = is_linear_layer(config, layer_index) if is_linear is None else is_linear
        self.linear_attn = GatedDeltaNet(DeltaNetSpec.of(config), kernels, tp) if is_linear else None
        self.self_attn = (DecoderAttention(gated_attention_spec(config, layer_index), rotary, kernels, tp)
                          if self.linear_attn is None else None)
        self.mlp = hybrid_mlp(config, layer_index, kernels, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels, GEMMA3_NORM)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels, GEMMA3_NORM)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        normed = NormInput(self.input_layernorm, hidden, residual)
        if self.linear_attn is not None:
            hidden, residual = self.linear_attn(normed, meta)
        else:
            assert self.self_attn is not None
            hidden, residual = self.self_attn(positions, normed, meta)
        return self.mlp(NormInput(self.post_attention_layernorm, hidden, residual))


class HybridDecoderModel(DecoderStack):
    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotary = RotaryEmbedding(config, head_dim, max_position)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(HybridDecoderLayer(config, i, rotary, kernels, tp)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels, GEMMA3_NORM)


class MtpHead(nn.Module):
    """The checkpoint's multi-token-prediction head (`mtp.`): from the target's last hidden state at position p (after
    its final norm, what its LM head reads) and the embedding of token p + 1, a hidden state whose logits (through the
    target's norm-free LM head after this head's own `norm`) predict token p + 2:

        h = fc([pre_fc_norm_embedding(embed(t[p + 1])); pre_fc_norm_hidden(hidden[p])])
        out = norm(layer(h))      one gated full-attention layer of the family (its MoE where the model has one)

    run at position p with its own KV cache. Drafting k tokens runs it k times, each time on the draft it drew and
    its own previous output in place of the target's hidden state. The embedding and LM head are the target's."""

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        super().__init__()
        hidden_size, eps = config.hidden_size, config.rms_norm_eps
        head_dim = getattr(config, "head_dim", None) or hidden_size // config.num_attention_heads
        rotary = RotaryEmbedding(config, head_dim, max_position)
        self.pre_fc_norm_embedding = RMSNorm(hidden_size, eps, kernels, GEMMA3_NORM)
        self.pre_fc_norm_hidden = RMSNorm(hidden_size, eps, kernels, GEMMA3_NORM)
        self.fc = Linear(2 * hidden_size, hidden_size, bias=False, kernels=kernels)
        # As vLLM builds it: the layer's MLP by the family's rule at index 0.
        self.layers = nn.ModuleList([HybridDecoderLayer(config, 0, rotary, kernels, tp, is_linear=False)])
        self.norm = RMSNorm(hidden_size, eps, kernels, GEMMA3_NORM)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
                ) -> torch.Tensor:
        """`embedded`: the next tokens' embeddings; `hidden`: the hidden states they follow. [num_tokens, hidden]."""
        mixed = self.fc(torch.cat([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out, residual = self.layers[0](positions, mixed, None, meta)
        out, _ = self.norm.forward_with_residual(out, residual)
        return out


class Qwen3NextForCausalLM(CausalLM):
    """Qwen3-Next; Qwen3.5 and Qwen3.5-MoE (text checkpoints and the language model of image-text ones) alike."""

    packed_modules = CausalLM.packed_modules | {
        "in_proj_qkvz": ("in_proj", "qkvz"), "in_proj_ba": ("in_proj", "ba"), "in_proj_qkv": ("in_proj", "qkv"),
        "in_proj_z": ("in_proj", "z"), "in_proj_b": ("in_proj", "b"), "in_proj_a": ("in_proj", "a")}
    expert_parts = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

    def build_decoder(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig,
                      tp: TensorParallel) -> nn.Module:
        return HybridDecoderModel(config, max_position, kernels, tp)

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        super().__init__(config, max_position, kernels, tp)
        self.mtp: MtpHead | None = None  # built by build_mtp_head

    def build_mtp_head(self, max_position: int, kernels: KernelConfig, tp: TensorParallel) -> None:
        """Speculative decoding's method `mtp`: the head is built, and loaded from the checkpoint's `mtp.` tensors."""
        self.mtp = MtpHead(self.config, max_position, kernels, tp)

    @staticmethod
    def mtp_checkpoint_prefix(config: PretrainedConfig) -> str:
        """Where the checkpoint keeps the MTP head's tensors."""
        return MTP_PREFIX

    def run_draft_head(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                     meta: AttentionMetadata) -> torch.Tensor:
        """The head's hidden states (what a later draft reads back)."""
        assert self.mtp is not None, "the model was built without its MTP head"
        return self.mtp(self.model.embed(input_ids), hidden, positions, meta)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The head's logits: through the target's LM head (the head's output is normed already)."""
        return self.compute_logits(hidden)

    def attention_layers(self) -> list[DecoderAttention]:
        """The decoder's full-attention layers, then the MTP head's where it is built (its own KV cache, in the
        full-attention group: it runs at the positions the target computed)."""
        layers = [layer.self_attn for layer in self.model.layers if layer.self_attn is not None]
        return layers + ([self.mtp.layers[0].self_attn] if self.mtp is not None else [])

    def linear_attention_layers(self) -> list[GatedDeltaNet]:
        """The layers that keep a state per sequence (gpu/state_cache.py)."""
        return [layer.linear_attn for layer in self.model.layers if layer.linear_attn is not None]

    def checkpoint_name(self, name: str) -> str | None:
        """The language model's name (an image-text checkpoint's under `model.language_model.`), None for the vision
        tower and the multi-token-prediction head (unless it is built)."""
        if name.startswith(MTP_PREFIX) and self.mtp is not None:
            return name.replace(".shared_expert.", ".shared_experts.")
        if LEFT_OUT.match(name):
            return None
        name = name.replace("model.language_model.", "model.", 1)
        return name.replace(".shared_expert.", ".shared_experts.")
