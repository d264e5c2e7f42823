"""Bare decoders (`Qwen3Model`, `LlamaModel`, `Qwen2Model`): a decoder without its LM head, as
sentence-transformers saves a decoder embedding model (parameter names without the `model.` prefix).
They pool (embeddings); they cannot generate."""

from transformers import PretrainedConfig

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.layers.attention import DecoderAttention
from gpu.models.causal_lm import CausalLM
from gpu.models.llama import Blocks, DecoderModel, attention_spec


class BareLlamaModel(DecoderModel):
    has_qk_norm = False
    packed_modules = CausalLM.packed_modules

    def __init__(self, config: PretrainedConfig, max_position: int, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        specs = [attention_spec(config, i, self.has_qk_norm) for i in range(config.num_hidden_layers)]
        super().__init__(config, max_position, Blocks(specs), kernels, tp)
        self.config = config

    def attention_layers(self) -> list[DecoderAttention]:
        return [layer.self_attn for layer in self.layers]


class BareQwen3Model(BareLlamaModel):
    has_qk_norm = True
