"""What the engine must know of a checkpoint before it builds a runner: limits and special tokens."""

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig


@dataclass(frozen=True)
class ModelInfo:
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    # Linear-attention layers (Gated DeltaNet): a state per sequence beside the KV cache (gpu/state_cache.py).
    has_linear_attention: bool = False


def load_hf_config(model_path: str | Path) -> PretrainedConfig:
    """The config of the model we serve: a multimodal checkpoint's (Gemma 3 and 4 image-text) is its language
    model's `text_config`, under the checkpoint's own architectures, dtype and embedding tie."""
    config = AutoConfig.from_pretrained(str(model_path))
    text = config.get_text_config(decoder=True)
    if text is not config:
        text.architectures = config.architectures
        for name in ("dtype", "tie_word_embeddings"):
            if getattr(config, name, None) is not None:
                setattr(text, name, getattr(config, name))
    return text


def checkpoint_dtype(config: PretrainedConfig) -> str | None:
    """The dtype the weights are stored in, e.g. "bfloat16" (transformers 5 says `dtype`, 4 `torch_dtype`)."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def read_model_info(model_path: str | Path) -> ModelInfo:
    config = load_hf_config(model_path)
    eos_ids = _as_ids(config.eos_token_id)
    generation_config = Path(model_path) / "generation_config.json"
    if generation_config.exists():  # chat models list their end-of-turn tokens here (Llama 3: several)
        eos_ids += tuple(t for t in _as_ids(json.loads(generation_config.read_text()).get("eos_token_id"))
                         if t not in eos_ids)
    return ModelInfo(
        vocab_size=config.vocab_size,
        max_position_embeddings=getattr(config, "max_position_embeddings", 4096),
        eos_token_ids=eos_ids,
        has_linear_attention="linear_attention" in (getattr(config, "layer_types", None) or ()),
    )


def _as_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, int) else tuple(value)
