"""gpt-oss: the Llama decoder with attention sinks on every layer, `layer_types` alternating sliding-window
(`sliding_window`) and full attention, q/k/v and o biases, YaRN (gpu/layers/rotary.py), block norms that scale in
float32, and a sparse MLP on every layer: a router with a bias whose top `num_experts_per_tok` logits are
softmaxed, experts with biases and the clamped SwiGLU ((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),
g = min(gate, limit)), stacked in the checkpoint as gpt-oss stacks them (gate and up interleaved column by column:
gpu/layers/moe.py). Its released checkpoints keep the experts in MXFP4 (gpu/quant/mxfp4.py).
"""

from dataclasses import replace

from torch import nn
from transformers import PretrainedConfig

from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.attention import AttentionSpec
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.layers.norm import NormConvention
from gpu.models.llama import LlamaForCausalLM, attention_spec


def gpt_oss_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    routing = Routing(config.num_local_experts, config.num_experts_per_tok, "top_k_softmax", has_bias=True)
    spec = MoeSpec(routing, config.intermediate_size, "clamped_swiglu", getattr(config, "swiglu_alpha", 1.702),
                   config.swiglu_limit, has_expert_bias=True, is_gpt_oss_layout=True)
    return SparseMoe(config, spec, kernels, tp)


class GptOssForCausalLM(LlamaForCausalLM):
    build_mlp = staticmethod(gpt_oss_mlp)
    block_norm = NormConvention(scales_in_float32=True)  # (weight * normed).to(dtype), as transformers' GptOssRMSNorm

    def attention_specs(self, config: PretrainedConfig) -> list[AttentionSpec]:
        return [replace(attention_spec(config, i, False), has_sinks=True) for i in range(config.num_hidden_layers)]

    def checkpoint_name(self, name: str) -> str | None:
        return name.replace(".mlp.router.", ".mlp.gate.")
