"""GLM-4-MoE (GLM-4.5, GLM-4.5-Air, GLM-4.6): the Llama decoder whose first `first_k_dense_replace` layers have a
dense MLP and the rest a sparse one: sigmoid scores with a correction bias that only chooses, group-limited top-k
(`n_group`, `topk_group`), renormalized where `norm_topk_prob` says and scaled by `routed_scaling_factor`, the
router in float32; and `n_shared_experts` shared experts on every token. The checkpoint's multi-token-prediction
layers (`num_nextn_predict_layers` of them after the last layer) are not run: their tensors are skipped (a log line
counts them).
"""

import re

from torch import nn
from transformers import PretrainedConfig

from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.mlp import MLP
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.layers.rotary import rope_parameters
from gpu.models.llama import LlamaForCausalLM

LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def glm4_moe_spec(config: PretrainedConfig) -> MoeSpec:
    routing = Routing(config.n_routed_experts, config.num_experts_per_tok, "sigmoid", bool(config.norm_topk_prob),
                      config.n_group, config.topk_group, float(config.routed_scaling_factor),
                      has_correction_bias=True, float32_logits=True)
    return MoeSpec(routing, config.moe_intermediate_size,
                   shared_intermediate_size=config.moe_intermediate_size * config.n_shared_experts)


def glm4_moe_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    check_attention(config)
    if layer_index < config.first_k_dense_replace:
        return MLP(config, kernels, tp)
    return SparseMoe(config, glm4_moe_spec(config), kernels, tp)


def check_attention(config: PretrainedConfig) -> None:
    """What GLM's attention needs beyond the Llama decoder's: partial rotary, q/k/v biases without an o bias, and
    per-head q/k norms where `use_qk_norm` says. Refused by name until the attention layer takes them."""
    unsupported = [name for name, is_set in (
        ("partial_rotary_factor", rope_parameters(config).get("partial_rotary_factor", 1.0) != 1.0),
        ("attention_bias", bool(getattr(config, "attention_bias", False))),
        ("use_qk_norm", bool(getattr(config, "use_qk_norm", False)))) if is_set]
    if unsupported:
        raise ValueError(f"Glm4MoeForCausalLM with {', '.join(unsupported)} is not supported yet")


class Glm4MoeForCausalLM(LlamaForCausalLM):
    build_mlp = staticmethod(glm4_moe_mlp)
    expert_parts = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

    def is_unused_tensor(self, name: str) -> bool:
        """The multi-token-prediction layers', numbered after the decoder's."""
        match = LAYER_INDEX.match(name)
        return match is not None and int(match[1]) >= self.config.num_hidden_layers
