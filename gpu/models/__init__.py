"""Model families by the `architectures` name in a checkpoint's config.json. A family that is a variant of another
is a line here, its differences read from its config (gpu/models/llama.py)."""

from gpu.models.causal_lm import CausalLM
from gpu.models.gemma import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from gpu.models.gemma4 import Gemma4ForCausalLM, Gemma4ForConditionalGeneration
from gpu.models.llama import LlamaForCausalLM, Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,  # Llama with q/k/v bias, which the config implies
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,  # Llama with a sliding window where the config sets one
    "Phi3ForCausalLM": LlamaForCausalLM,  # fused q/k/v and gate/up tensors, partial rotary, longrope: config
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,  # its language model
    "Gemma4ForCausalLM": Gemma4ForCausalLM,
    "Gemma4ForConditionalGeneration": Gemma4ForConditionalGeneration,  # its language model
}


def model_class(architectures: list[str] | None) -> type[CausalLM]:
    for name in architectures or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    raise ValueError(f"unsupported architecture {architectures}; supported: {sorted(MODEL_CLASSES)}")
