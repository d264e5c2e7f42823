"""Model families by the `architectures` name in a checkpoint's config.json. A family that is a variant of another
is a line here, its differences read from its config (gpu/models/llama.py)."""

from torch import nn
from transformers import PretrainedConfig

from gpu.models.bare_decoder import BareLlamaModel, BareQwen3Model
from gpu.models.bert import BertForSequenceClassification, BertModel, RobertaForSequenceClassification
from gpu.models.causal_lm import CausalLM
from gpu.models.gemma import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from gpu.models.gemma4 import Gemma4ForCausalLM, Gemma4ForConditionalGeneration
from gpu.models.glm4_moe import Glm4MoeForCausalLM
from gpu.models.gpt_oss import GptOssForCausalLM
from gpu.models.llama import LlamaForCausalLM, Qwen3ForCausalLM
from gpu.models.mixtral import MixtralForCausalLM
from gpu.models.modernbert import ModernBertForSequenceClassification, ModernBertModel
from gpu.models.qwen3_moe import Qwen3MoeForCausalLM
from gpu.models.qwen3_next import Qwen3NextForCausalLM

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
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3NextForCausalLM,  # Gated DeltaNet hybrids alike: their differences are config
    "Qwen3_5MoeForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForConditionalGeneration": Qwen3NextForCausalLM,  # its language model
    "Qwen3_5MoeForConditionalGeneration": Qwen3NextForCausalLM,
}

# Models that pool only (embeddings, scores): bare decoders as sentence-transformers saves them, and encoders.
POOLING_MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "LlamaModel": BareLlamaModel,
    "Qwen2Model": BareLlamaModel,
    "Qwen3Model": BareQwen3Model,
    "BertModel": BertModel,
    "RobertaModel": BertModel,  # BERT with positions numbered after the padding id, which the config implies
    "XLMRobertaModel": BertModel,
    "ModernBertModel": ModernBertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    "RobertaForSequenceClassification": RobertaForSequenceClassification,
    "XLMRobertaForSequenceClassification": RobertaForSequenceClassification,
    "ModernBertForSequenceClassification": ModernBertForSequenceClassification,
}


def mtp_checkpoint_prefix(config: PretrainedConfig) -> str | None:
    """Where the checkpoint keeps the multi-token-prediction head we run for its family (speculative decoding's
    method mtp); None: we run none for it."""
    for name in config.architectures or []:
        cls = MODEL_CLASSES.get(name)
        if cls is not None and hasattr(cls, "mtp_checkpoint_prefix"):
            return cls.mtp_checkpoint_prefix(config)
    return None


def model_class(architectures: list[str] | None) -> type[nn.Module]:
    classes = MODEL_CLASSES | POOLING_MODEL_CLASSES
    for name in architectures or []:
        if name in classes:
            return classes[name]
    raise ValueError(f"unsupported architecture {architectures}; supported: {sorted(classes)}")
