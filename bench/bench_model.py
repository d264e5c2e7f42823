"""Random checkpoints of any shape transformers knows, with a tokenizer that covers the whole vocabulary.

Speed does not depend on the weights' values, so a benchmark can run on random weights of the shape it measures. A
shape is a config.json (any family) or a name in bench/shapes.toml; the tensors come from transformers' model on the
meta device, drawn (norms ones, the rest N(0, 0.02)) and written straight to safetensors shards. `build_config_only`
writes config.json and the tokenizer alone, for the engine to draw the weights (`--load-format dummy`). The tokenizer
is word-level (id i is the word "w<i>"): every sampled id decodes to text, and a prompt's text encodes back to its ids.

A checkpoint may be quantized (`quantization`, QUANTIZATIONS): every decoder projection in that format's tensors with
valid scales (FP8 in 128x128 blocks; GPTQ int4 in symmetric groups of 128; GGUF Q4_K_M's block types as llama.cpp
assigns them, as our GGUF conversion writes them for a GPU); embeddings, norms and the LM head stay bf16.

    python -m bench.bench_model qwen3-8b /tmp/qwen3-8b                          # a named shape
    python -m bench.bench_model qwen3-30b-a3b /tmp/qwen3-30b-a3b --config-only  # for --load-format dummy
    python -m bench.bench_model qwen3-8b /tmp/qwen3-8b-fp8 fp8                  # quantized
"""

import json
import sys
import tomllib
from pathlib import Path

import torch

SHAPES_FILE = Path(__file__).with_name("shapes.toml")


def _load_shapes() -> dict[str, dict[str, object]]:
    """SHAPES_FILE's shapes, each with its `base` shape's values under its own."""
    tables = tomllib.loads(SHAPES_FILE.read_text())

    def resolved(name: str) -> dict[str, object]:
        values = dict(tables[name])
        base = values.pop("base", None)
        return {**resolved(str(base)), **values} if base else values

    return {name: resolved(name) for name in tables}


SHAPES = _load_shapes()
DEFAULT_SHAPE = "qwen3-0.6b"
_SHARD_BYTES = 4 << 30
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZATIONS = {
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "w4a16": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "gguf-q4_k_m": {"quant_method": "gguf"},  # + each projection's block type
}
_GGUF_SCALES = {"Q4_K": ((0, 2), 5e-4), "Q6_K": ((208,), 1e-4)}  # fp16 fields of a block, their magnitude
_GGUF_BLOCK = {"Q4_K": 144, "Q6_K": 210}  # bytes per 256 weights


def random_projection(quantization: str, kind: str, rows: int, cols: int, generator: torch.Generator
                      ) -> dict[str, torch.Tensor]:
    """A projection [rows, cols]'s checkpoint tensors by suffix, in `quantization`'s format (`kind`: its GGUF block
    type), on the generator's device: weights about N(0, 0.02) in spread."""
    device = generator.device
    if quantization == "fp8":
        levels = (torch.randn(rows, cols, device=device, generator=generator) * 64).to(torch.float8_e4m3fn)
        return {"weight": levels, "weight_scale_inv": torch.full((rows // 128, cols // 128), 0.02 / 64, device=device)}
    if quantization == "w4a16":
        return {"qweight": torch.randint(-(2**31), 2**31 - 1, (cols // 8, rows), dtype=torch.int32, device=device,
                                         generator=generator),
                "qzeros": torch.full((cols // 128, rows // 8), 0x77777777, dtype=torch.int32, device=device),
                "scales": torch.full((cols // 128, rows), 0.005, dtype=torch.float16, device=device),
                "g_idx": (torch.arange(cols, device=device) // 128).to(torch.int32)}
    blocks = torch.randint(0, 256, (rows, cols // 256, _GGUF_BLOCK[kind]), dtype=torch.uint8, device=device,
                           generator=generator)
    offsets, magnitude = _GGUF_SCALES[kind]
    scales = (torch.rand(rows, cols // 256, device=device, generator=generator) * 0.5 + 0.5) * magnitude
    for offset in offsets:
        blocks[:, :, offset : offset + 2] = scales.half().unsqueeze(-1).view(torch.uint8)
    return {"qweight": blocks.view(rows, -1)}


def gguf_q4_k_m_type(module: str, num_layers: int) -> str:
    """llama.cpp's Q4_K_M: Q6_K for v and down projections in its `use_more_bits` layers, Q4_K elsewhere."""
    layer, leaf = int(module.split(".")[2]), module.rsplit(".", 1)[1]
    more_bits = layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2
    return "Q6_K" if leaf in ("v_proj", "down_proj") and more_bits else "Q4_K"


def shape_config(shape: str) -> dict[str, object]:
    """A named shape, or the config.json at that path."""
    return dict(SHAPES[shape]) if shape in SHAPES else json.loads(Path(shape).read_text())


def build_random_checkpoint(directory: str | Path, config: dict[str, object], dtype: torch.dtype = torch.bfloat16,
                            seed: int = 0, quantization: str | None = None) -> Path:
    """Writes a checkpoint of `config` with random weights (its projections in `quantization`'s format, if given) and
    the word tokenizer into `directory`; reused when there. Drawn on the GPU where there is one."""
    from safetensors.torch import save_file

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    model_config, model = _meta_model(config, dtype)
    directory.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    block_types: dict[str, str] = {}

    def flush() -> None:
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    for name, param in model.named_parameters():  # a tied LM head is its embedding's: listed once
        module = name.removesuffix(".weight")
        if quantization and module.rsplit(".", 1)[-1] in PROJECTIONS and name.endswith(".weight"):
            kind = gguf_q4_k_m_type(module, model_config.num_hidden_layers) if quantization.startswith("gguf") else ""
            block_types[module] = kind
            parts = random_projection(quantization, kind, *param.shape, generator)
            shard.update({f"{module}.{suffix}": tensor for suffix, tensor in parts.items()})
        else:
            tensor = torch.empty(param.shape, dtype=dtype, device=device)
            shard[name] = tensor.fill_(1.0) if name.endswith("norm.weight") else tensor.normal_(0, 0.02,
                                                                                               generator=generator)
        if sum(t.numel() * t.element_size() for t in shard.values()) >= _SHARD_BYTES:
            flush()
    if shard:
        flush()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if quantization:
        model_config.quantization_config = dict(QUANTIZATIONS[quantization])
        if quantization.startswith("gguf"):
            model_config.quantization_config["tensor_types"] = block_types
    model_config.save_pretrained(directory)
    return build_word_tokenizer(directory, int(config["vocab_size"]))  # type: ignore[call-overload]


def build_config_only(directory: str | Path, config: dict[str, object], dtype: torch.dtype = torch.bfloat16) -> Path:
    """Writes config.json and the word tokenizer into `directory`, no weights: a model for `--load-format dummy`."""
    directory = Path(directory)
    if not (directory / "config.json").exists():
        model_config, _ = _meta_model(config, dtype)
        model_config.save_pretrained(directory)
    return build_word_tokenizer(directory, int(config["vocab_size"]))  # type: ignore[call-overload]


def _meta_model(config: dict[str, object], dtype: torch.dtype) -> tuple[object, torch.nn.Module]:
    """transformers' config of `config` (its architectures named) and its model on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {k: v for k, v in config.items() if k != "model_type"}
    model_config = AutoConfig.for_model(str(config["model_type"]), **settings, dtype=str(dtype).removeprefix("torch."))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    model_config.architectures = [type(model).__name__]
    return model_config, model


def build_word_tokenizer(directory: str | Path, vocab_size: int) -> Path:
    """Writes tokenizer.json and tokenizer_config.json: word "w<i>" is id i, words split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
    return directory


if __name__ == "__main__":
    build = build_config_only if "--config-only" in sys.argv[3:] else build_random_checkpoint
    quantization = next((a for a in sys.argv[3:] if a in QUANTIZATIONS), None)
    print(build(sys.argv[2], shape_config(sys.argv[1]), **({"quantization": quantization} if quantization else {})))
