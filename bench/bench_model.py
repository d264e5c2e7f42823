"""The benchmark model: a Qwen3-0.6B-shaped random bf16 checkpoint with a tokenizer that covers its vocab.

No weights can be downloaded on the GPU machine, so the figures are taken on random weights of the
shape the published figures (nano-vllm, vLLM) use; speed does not depend on the values. The tests'
tiny tokenizer knows a few hundred tokens, so most ids the random model samples would decode to
nothing and a server would stream no text for them: a serving benchmark would see too few chunks,
and would not pay for detokenization as it does with a real model. This tokenizer is a word-level
one over the whole vocabulary (id i is the word "w<i>"), so every id decodes to text and a prompt's
text encodes back to the same ids (`--prompt-format text` relies on it). The tensor-parallel benchmark
uses larger shapes, Qwen3-14B and 32B (their config.json's), and the single-GPU larger-model run Qwen3-8B's,
built the same way (`build_large_bench_model`).
"""

import json
from pathlib import Path

import torch

DEFAULT_DIR = "/tmp/qwen3-0.6b-bench"  # where the device scripts build it once per machine
QWEN3_0P6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151645,
)
QWEN3_14B = dict(
    vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
    num_attention_heads=40, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=151645,
)
QWEN3_32B = dict(QWEN3_14B, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64)
# Qwen/Qwen3-8B's config.json: 8.2B parameters, 16.4 GB in bf16, one H100 holds it with room for the KV cache.
QWEN3_8B = dict(QWEN3_14B, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32)
LARGE_SHAPES = {"qwen3-8b": QWEN3_8B, "qwen3-14b": QWEN3_14B, "qwen3-32b": QWEN3_32B}
_SHARD_BYTES = 4 << 30


def build_word_tokenizer(directory: str | Path, vocab_size: int) -> Path:
    """Writes tokenizer.json and tokenizer_config.json: word "w<i>" is id i, words split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
    return directory


def build_bench_model(directory: str | Path = DEFAULT_DIR) -> Path:
    """The random bf16 Qwen3-0.6B checkpoint (built on the GPU if present; reused when there) and the word
    tokenizer beside it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory = Path(directory)
    if not (directory / "config.json").exists():
        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_0P6B)).to(torch.bfloat16)
        model.save_pretrained(directory, safe_serialization=True)
    if not (directory / "tokenizer.json").exists():
        build_word_tokenizer(directory, int(QWEN3_0P6B["vocab_size"]))
    return directory


def build_small_bench_model(directory: str | Path, vocab_size: int = 10_240) -> Path:
    """A tiny random Qwen3 (float32) with the word tokenizer, for CPU runs of the benchmark scripts.

    Its vocabulary covers the workloads' prompt ids ([0, 10000)), which the tests' tiny model's does not.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=vocab_size - 1,
    )
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return build_word_tokenizer(directory, vocab_size)


def build_large_bench_model(directory: str | Path, shape: str) -> Path:
    """A random bf16 checkpoint of a larger shape (`qwen3-8b`, `qwen3-14b`, `qwen3-32b`) with the word tokenizer
    beside it."""
    directory = build_random_qwen3(directory, LARGE_SHAPES[shape])
    if not (directory / "tokenizer.json").exists():
        build_word_tokenizer(directory, int(LARGE_SHAPES[shape]["vocab_size"]))  # type: ignore[arg-type]
    return directory


def build_random_qwen3(directory: str | Path, shape: dict[str, object], seed: int = 0) -> Path:
    """Writes a bf16 Qwen3 checkpoint of `shape` with random weights, straight to safetensors shards.

    No model is built: the parameter names and shapes come from transformers' model on the meta device, and
    each tensor is drawn on the GPU where there is one (norms are ones, the rest N(0, 0.02) as transformers
    initializes them), so a 14B checkpoint takes the time of writing it. Reused when present."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(**shape, dtype="bfloat16", architectures=["Qwen3ForCausalLM"])
    with torch.device("meta"):
        names_and_shapes = [(n, p.shape) for n, p in Qwen3ForCausalLM(config).named_parameters()]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}

    def flush() -> None:
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    for name, param_shape in names_and_shapes:
        if name.endswith("norm.weight"):
            tensor = torch.ones(param_shape, dtype=torch.bfloat16, device=device)
        else:
            tensor = torch.empty(param_shape, dtype=torch.bfloat16, device=device).normal_(0, 0.02, generator=generator)
        shard[name] = tensor
        if sum(t.numel() * 2 for t in shard.values()) >= _SHARD_BYTES:
            flush()
    if shard:
        flush()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config.save_pretrained(directory)
    return directory
