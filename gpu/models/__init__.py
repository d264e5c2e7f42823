"""Model families by the `architectures` name in a checkpoint's config.json."""

from torch import nn

from gpu.models.llama import LlamaForCausalLM
from gpu.models.qwen3 import Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,  # Llama with q/k/v bias, which the config implies
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(architectures: list[str] | None) -> type[nn.Module]:
    for name in architectures or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    raise ValueError(f"unsupported architecture {architectures}; supported: {sorted(MODEL_CLASSES)}")
