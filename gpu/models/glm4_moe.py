"""GLM-4-MoE (GLM-4.5, GLM-4.5-Air, GLM-4.6): the Llama decoder with GLM's attention (q/k/v biases where
`attention_bias` says but never an o bias, per-head q/k norms where `use_qk_norm` says, the rotation of the first
`partial_rotary_factor` of each head: gpu/layers/rotary.py), whose first `first_k_dense_replace` layers have a
dense MLP and the rest a sparse one: sigmoid scores with a correction bias that only chooses, group-limited top-k
(`n_group`, `topk_group`), renormalized where `norm_topk_prob` says and scaled by `routed_scaling_factor`, the
router in float32; and `n_shared_experts` shared experts on every token. The checkpoint's multi-token-prediction
layers (`num_nextn_predict_layers` of them after the last layer) are not run: their tensors are skipped (a log line
counts them).
"""

import re
from dataclasses import replace

from torch import nn
from transformers import PretrainedConfig

from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.attention import AttentionSpec
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.models.llama import LlamaForCausalLM, attention_spec, dense_mlp

LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


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


class Glm4MoeForCausalLM(LlamaForCausalLM):
    build_mlp = staticmethod(glm4_moe_mlp)
    expert_parts = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

    def attention_specs(self, config: PretrainedConfig) -> list[AttentionSpec]:
        return [replace(attention_spec(config, i, bool(getattr(config, "use_qk_norm", False))), o_bias=False)
                for i in range(config.num_hidden_layers)]

    def checkpoint_name(self, name: str) -> str | None:
        """None for the multi-token-prediction layers' tensors, numbered after the decoder's layers."""
        match = LAYER_INDEX.match(name)
        return None if match is not None and int(match[1]) >= self.config.num_hidden_layers else name
