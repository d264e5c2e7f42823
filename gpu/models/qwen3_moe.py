"""Qwen3-MoE: Qwen3 whose MLP is sparse on every `decoder_sparse_step`-th layer outside `mlp_only_layers`:
softmax routing over `num_experts`, the top `num_experts_per_tok` renormalized where `norm_topk_prob` says."""

from torch import nn
from transformers import PretrainedConfig

from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.models.llama import Qwen3ForCausalLM, dense_mlp


def is_sparse_layer(config: PretrainedConfig, layer_index: int) -> bool:
    return (layer_index not in (getattr(config, "mlp_only_layers", None) or []) and config.num_experts > 0
            and (layer_index + 1) % config.decoder_sparse_step == 0)


def qwen3_moe_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    if not is_sparse_layer(config, layer_index):
        return dense_mlp(config, layer_index, kernels, tp)
    routing = Routing(config.num_experts, config.num_experts_per_tok, renormalize=bool(config.norm_topk_prob))
    return SparseMoe(config, MoeSpec(routing, config.moe_intermediate_size), kernels, tp)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    build_mlp = staticmethod(qwen3_moe_mlp)
    expert_parts = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
