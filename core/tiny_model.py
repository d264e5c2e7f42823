"""Builds tiny random Hugging Face checkpoints: the tests' models and the built-in `tiny` model.

A checkpoint is a real directory (config.json, model.safetensors, tokenizer files with a ChatML
chat template) made with transformers' own model classes, so it goes through the same loader as
any downloaded model. The tokenizer is a byte-level BPE trained on a small built-in text: every
string, emoji and CJK included, can be encoded. Weights are random: output is gibberish, but the
same weights give the same tokens in transformers and here, which is what the tests check.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from core.model_files.cache import DEFAULT_CACHE_DIR, building

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A server streams tokens to many clients at once.
Continuous batching keeps the accelerator busy: new requests join while others are decoding.
Paged attention stores keys and values in fixed-size blocks, so memory is never fragmented.
Prefix caching reuses the blocks of a shared system prompt across requests and conversations.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.
Once upon a time there was a little model that wanted to speak. It learned words one by one.
def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
{"name": "openai-serve", "stream": true, "max_tokens": 16, "temperature": 0.7}
1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 -42 +7 = % $ # @ & * ( ) [ ] < > / \\ | ~ ^
你好，世界。今天天气很好。我们一起学习语言模型。日本語のテキストも少しあります。
Emoji travel well: 🙂 🚀 🎉 👍 ❤️ 🌍 — and accents too: café, naïve, déjà vu, Zürich, São Paulo.
"""


# Tiny architectures: name -> (transformers model_type of the config, its causal-LM class).
ARCHITECTURES = {
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "gemma3_vision": ("gemma3", "Gemma3ForConditionalGeneration"),  # a tiny vision tower beside the text model
    "gemma4": ("gemma4_text", "Gemma4ForCausalLM"),
}


@dataclass(frozen=True)
class TinyModelSpec:
    architecture: str = "qwen3"  # a key of ARCHITECTURES
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    vocab_size: int = 512
    # Larger than the usual 0.02 so logits are spread out and greedy choices are not near-ties.
    initializer_range: float = 0.2
    seed: int = 0
    dtype: str = "float32"
    # The family's own config fields (sliding_window, layer_types, partial_rotary_factor, ...), as (name, value).
    overrides: tuple[tuple[str, object], ...] = ()
    # Norm weights (and Gemma 4's layer scalars) moved off their initial ones or zeros, so a family's norm
    # convention shows in the output.
    perturbs_norms: bool = False


def build_tiny_model(directory: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Writes a checkpoint directory for `spec` and returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(spec.vocab_size)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(spec.seed)
    model = _model_class(spec.architecture)(_model_config(spec, tokenizer))
    if spec.perturbs_norms:
        _perturb_norms(model)
    model.to(getattr(torch, spec.dtype)).save_pretrained(directory, safe_serialization=True)
    (directory / "tiny_model_spec.json").write_text(json.dumps(spec.__dict__, indent=1))
    return directory


def tiny_model_dir(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The built-in tiny model (`--model tiny`), built once into the cache directory."""
    directory = cache_dir / "tiny-qwen3-v1"
    if not (directory / "config.json").exists():
        with building(directory) as scratch:
            build_tiny_model(scratch)
    return directory


def _build_tokenizer(vocab_size: int):  # noqa: ANN202 - a transformers tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    core.train_from_iterator(TRAINING_TEXT.splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None, chat_template=CHATML_TEMPLATE,
    )


def _model_config(spec: TinyModelSpec, tokenizer):  # noqa: ANN001, ANN202
    from transformers import AutoConfig

    if spec.architecture not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {spec.architecture!r}; one of {sorted(ARCHITECTURES)}")
    fields = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        initializer_range=spec.initializer_range,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        rms_norm_eps=1e-6,
        **dict(spec.overrides),
    )
    model_type = ARCHITECTURES[spec.architecture][0]
    if spec.architecture == "gemma3_vision":
        return _gemma3_vision_config(fields)
    return AutoConfig.for_model(model_type, **fields)


def _gemma3_vision_config(text_fields: dict):  # noqa: ANN202
    """Gemma 3's image-text config: the text model as asked, a tiny vision tower whose tokens lie in the vocabulary."""
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    vocab = text_fields["vocab_size"]
    text = Gemma3TextConfig(**text_fields)
    return Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                        boi_token_index=vocab - 3, eoi_token_index=vocab - 2, image_token_index=vocab - 1,
                        initializer_range=text_fields["initializer_range"],
                        tie_word_embeddings=text_fields["tie_word_embeddings"])


def _perturb_norms(model) -> None:  # noqa: ANN001
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layer_scalar"):
                param.add_(torch.rand(param.shape) * 0.5 - 0.25)


def has_architecture(architecture: str) -> bool:
    """Whether the installed transformers has the architecture's model class."""
    import transformers

    return hasattr(transformers, ARCHITECTURES[architecture][1])


def _model_class(architecture: str):  # noqa: ANN202
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {architecture!r}; one of {sorted(ARCHITECTURES)}")
    return getattr(transformers, ARCHITECTURES[architecture][1])
