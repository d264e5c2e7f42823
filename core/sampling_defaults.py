"""The sampling values a request gets for the fields it leaves out, as vLLM's `--generation-config` chooses them.

`auto` (the default): the model's own, from its checkpoint's generation_config.json, where its makers state
what it samples best with (temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens is
max_tokens). `vllm`: the server's neutral values (temperature 1, no filters, no penalty). A folder: the
generation_config.json in it. `--override-generation-config` sets values over any of them. A field the request
sends always wins. As in vLLM, `do_sample` is not read: the file's values apply whatever it says.
"""

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from core.sampling_params import SamplingParams, SamplingParamsError

logger = logging.getLogger(__name__)

FROM_MODEL = "auto"
NEUTRAL = "vllm"  # vLLM's name for the server's own defaults
GENERATION_CONFIG_FILE = "generation_config.json"
# A generation config's names of the values read here -> SamplingParams' names for them.
CONFIG_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
_INTEGERS = ("top_k", "max_tokens")


# The server's neutral values (`--generation-config vllm`): SamplingParams' own, max_tokens None (the endpoint's
# default: the rest of the context, or 16 for legacy completions). Defaults are SamplingParams whose fields named
# in CONFIG_NAMES are what a request that leaves them out gets; SamplingParams checks their ranges.
SERVER_DEFAULTS = SamplingParams(max_tokens=None)


def fill_max_tokens(params: SamplingParams, defaults: SamplingParams, room: int) -> SamplingParams:
    """`params` of a request that left max_tokens out (None) with the default one, at most the `room` its prompt
    leaves in the context: as in vLLM, a default never makes a request fail. A request's own value stays."""
    if params.max_tokens is not None or defaults.max_tokens is None:
        return params
    return replace(params, max_tokens=min(defaults.max_tokens, room))


def changes(defaults: SamplingParams) -> dict[str, object]:
    """The defaults that differ from the server's neutral ones."""
    return {name: getattr(defaults, name) for name in CONFIG_NAMES.values()
            if getattr(defaults, name) != getattr(SERVER_DEFAULTS, name)}


def load_sampling_defaults(model_dir: str, source: str = FROM_MODEL,
                           override: Mapping[str, object] | None = None) -> SamplingParams:
    """The defaults `source` (auto, vllm or a folder) names for the checkpoint in `model_dir`, `override` set over
    them; logged. ValueError for a file or a value that cannot be used, naming it."""
    path = None if source == NEUTRAL else Path(model_dir if source == FROM_MODEL else source) / GENERATION_CONFIG_FILE
    values = {} if path is None else _read_file(path, must_exist=source != FROM_MODEL)
    file_defaults = sampling_defaults_from(values, f"{path} (--generation-config vllm ignores it)")
    defaults = sampling_defaults_from({**values, **(override or {})}, "override_generation_config")
    changed = ", ".join(f"{name}={value}" for name, value in changes(defaults).items())
    if changed:
        origins = [f"the generation config {path}"] if changes(file_defaults) else []
        origins += ["--override-generation-config"] if override else []
        logger.info("Default sampling parameters have been overridden by %s: %s. A request's own fields win; "
                    "--generation-config vllm uses the server's defaults.", " and ".join(origins), changed)
    else:
        logger.info("default sampling parameters: the server's own (temperature 1.0, no top_p, top_k or min_p "
                    "filter, no repetition penalty)")
    return defaults


def sampling_defaults_from(values: Mapping[str, object], source: str) -> SamplingParams:
    """Defaults from a generation config's values (other keys are ignored: a file holds token ids and more);
    errors name the config's key. HF's top_k 0 (vLLM's -1 too) means no top-k."""
    known = {CONFIG_NAMES[key]: _number(key, value, source) for key, value in values.items()
             if key in CONFIG_NAMES and value is not None}
    if known.get("top_k", 1) <= 0:
        known["top_k"] = None
    try:
        return replace(SERVER_DEFAULTS, **known)  # type: ignore[arg-type]
    except SamplingParamsError as exc:
        key = next(k for k, name in CONFIG_NAMES.items() if name == exc.param)
        raise ValueError(f"{source}: '{key}' {str(exc).removeprefix(exc.param).strip()}") from exc


def check_override(override: Mapping[str, object]) -> None:
    """`--override-generation-config`: every key one this server reads, every value usable."""
    unknown = sorted(set(override) - set(CONFIG_NAMES))
    if unknown:
        raise ValueError(f"override_generation_config: unknown keys {unknown}; known: {', '.join(CONFIG_NAMES)}")
    sampling_defaults_from(override, "override_generation_config")


def _number(key: str, value: object, source: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{source}: '{key}' must be a number, got {json.dumps(value)}")
    if CONFIG_NAMES[key] not in _INTEGERS:
        return float(value)
    if not float(value).is_integer():
        raise ValueError(f"{source}: '{key}' must be an integer, got {value}")
    return int(value)


def _read_file(path: Path, must_exist: bool) -> dict[str, object]:
    if not path.is_file():
        if must_exist:
            raise ValueError(f"--generation-config: there is no {path}")
        return {}  # a model that states no defaults
    try:
        values = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(values, dict):
        raise ValueError(f"{path}: must hold one JSON object")
    return values
