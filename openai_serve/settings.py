"""Serving settings: built-in defaults, then a `--config` JSON file, then command-line flags.

A config file is one JSON object whose keys are the long flag names, with dashes or underscores
(`"max-model-len"` or `"max_model_len"`); see configs/. JSON rather than YAML so that no extra
dependency is needed. An unknown key is an error, never silently ignored.
"""

import json
from pathlib import Path

from core import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from openai_serve.server_config import DEFAULT_MAX_BODY_BYTES, ServerConfig

BUILTIN_MODEL_NAME = "openai-serve-tiny"

DEFAULTS: dict[str, object] = {
    "model": None,
    "served_model_name": None,
    "host": "127.0.0.1",
    "port": 8000,
    "api_key": None,
    "allowed_origins": ["*"],
    "max_model_len": None,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "block_size": 16,
    "kv_cache_blocks": None,
    "gpu_memory_utilization": 0.9,
    "dtype": "auto",
    "device": "auto",
    "enforce_eager": False,
    "enable_prefix_caching": True,
    "async_scheduling": True,
    "engine_process": True,
    "attention_backend": "auto",
    "chat_template": None,
    "seed": 0,
    "max_request_body_bytes": DEFAULT_MAX_BODY_BYTES,
    "max_pending_requests": 4096,
    "log_level": "info",
    "gil_switch_interval_ms": 5.0,
}


# The JSON types each setting accepts (None is accepted wherever the default is None).
_TYPES: dict[str, type | tuple[type, ...]] = {
    **{key: type(value) for key, value in DEFAULTS.items() if value is not None},
    "gpu_memory_utilization": (int, float),
    "gil_switch_interval_ms": (int, float),
    "allowed_origins": (list, str),
    "model": str, "served_model_name": (str, list), "api_key": str, "max_model_len": int,
    "kv_cache_blocks": int, "chat_template": str,
}


def load_config_file(path: str | Path) -> dict[str, object]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"--config {path}: must hold one JSON object")
    settings = {key.replace("-", "_"): value for key, value in raw.items()}
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"--config {path}: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
    for key, value in settings.items():
        if not _has_type(key, value):
            raise ValueError(f"--config {path}: {key!r} cannot be {json.dumps(value)}")
    return settings


def _has_type(key: str, value: object) -> bool:
    if value is None:
        return DEFAULTS[key] is None
    if isinstance(value, bool):  # JSON true/false are not numbers, although bool subclasses int
        return _TYPES[key] is bool
    return isinstance(value, _TYPES[key])


def merge(file_settings: dict[str, object], flags: dict[str, object]) -> dict[str, object]:
    """Flags override the file, which overrides the defaults."""
    return {**DEFAULTS, **file_settings, **flags}


def engine_config(settings: dict[str, object], model_dir: str) -> EngineConfig:
    s = settings
    return EngineConfig(
        model=ModelConfig(
            model=model_dir, dtype=s["dtype"], device=s["device"], seed=s["seed"],
            max_model_len=s["max_model_len"], enforce_eager=s["enforce_eager"],
            attention_backend=s["attention_backend"],
        ),
        cache=CacheConfig(
            block_size=s["block_size"], num_blocks=s["kv_cache_blocks"],
            gpu_memory_utilization=s["gpu_memory_utilization"], enable_prefix_caching=s["enable_prefix_caching"],
        ),
        scheduler=SchedulerConfig(max_num_seqs=s["max_num_seqs"], max_num_batched_tokens=s["max_num_batched_tokens"],
                                  async_scheduling=s["async_scheduling"]),
    )  # type: ignore[arg-type]


def server_config(settings: dict[str, object], chat_template: str | None) -> ServerConfig:
    s = settings
    return ServerConfig(
        served_model_names=served_model_names(s), host=s["host"], port=s["port"], api_key=s["api_key"],
        allowed_origins=tuple(parse_origins(s["allowed_origins"])), chat_template=chat_template,
        max_request_body_bytes=s["max_request_body_bytes"], max_pending_requests=s["max_pending_requests"],
        log_level=s["log_level"], gil_switch_interval_ms=float(s["gil_switch_interval_ms"]),  # type: ignore[arg-type]
    )  # type: ignore[arg-type]


def served_model_names(settings: dict[str, object]) -> tuple[str, ...]:
    """As in vLLM: the --served-model-name values, else the --model argument as given."""
    names = settings["served_model_name"]
    if isinstance(names, str):
        return (names,)
    if names:
        return tuple(names)  # type: ignore[arg-type]
    return (str(settings["model"] or BUILTIN_MODEL_NAME),)


def parse_origins(value: object) -> list[str]:
    """A list, a JSON list (vLLM's spelling) or a comma-separated string; empty: no CORS."""
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value).strip()
    if text.startswith("["):
        return [str(v) for v in json.loads(text)]
    return [origin.strip() for origin in text.split(",") if origin.strip()]
