"""Mixtral: the Llama decoder (with a sliding window where the config sets one) whose every MLP is sparse
(`block_sparse_moe` in its checkpoints): softmax routing over `num_local_experts`, the top `num_experts_per_tok`
renormalized; the experts' gate, down and up are w1, w2, w3."""

from torch import nn
from transformers import PretrainedConfig

from gpu.config import KernelConfig
from gpu.distributed import TensorParallel
from gpu.layers.moe import MoeSpec, Routing, SparseMoe
from gpu.models.llama import LlamaForCausalLM


def mixtral_mlp(config: PretrainedConfig, layer_index: int, kernels: KernelConfig, tp: TensorParallel) -> nn.Module:
    routing = Routing(config.num_local_experts, config.num_experts_per_tok)
    return SparseMoe(config, MoeSpec(routing, config.intermediate_size), kernels, tp)


class MixtralForCausalLM(LlamaForCausalLM):
    build_mlp = staticmethod(mixtral_mlp)
    expert_parts = {"w1": "gate", "w3": "up", "w2": "down"}

    def checkpoint_name(self, name: str) -> str | None:
        return name.replace(".block_sparse_moe.", ".mlp.")
