"""`openai-serve`'s settings: each field's default, then a `--config` JSON file, then flags.

Flags, config-file keys, defaults and help all come from the config dataclasses' fields
(core/config.py, openai_serve/server_config.py; see core.config.setting): there is no second table.
A config file is one JSON object whose keys are the long flag names, with dashes or underscores
(`"max-model-len"` or `"max_model_len"`); see configs/. JSON rather than YAML so that no extra
dependency is needed. An unknown key is an error, never silently ignored.
"""

import argparse
import json
import types
from dataclasses import MISSING, dataclass, replace
from pathlib import Path
from typing import Union, get_args, get_origin

from core.config import EngineConfig, Setting, config_from, engine_config, engine_settings, settings_of
from core.model_files import default_model
from openai_serve.server_config import ServerConfig

DEFAULT_MODEL_NAME = default_model.NAME

SETTINGS: dict[str, Setting] = {s.name: s for s in [*engine_settings(), *settings_of(ServerConfig)]}
_ENGINE_NAMES = {s.name for s in engine_settings()}


def load_chat_template(value: str | None) -> str | None:
    """`--chat-template`: a file path, or the template text itself (as vLLM accepts)."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")


# How a string from a flag or a file becomes a value, where that is more than its type says.
_PARSERS = {"chat_template": load_chat_template}


@dataclass(frozen=True)
class Settings:
    """What `openai-serve` was asked to run. `engine.model.model` is the model as named (a directory, a
    .gguf file, a Hub id, a built-in name, '' for the default one) until the CLI resolves it to a checkpoint
    directory."""

    engine: EngineConfig
    server: ServerConfig

    @property
    def model(self) -> str | None:
        return self.engine.model.model or None

    def with_model(self, engine: EngineConfig, name: str) -> "Settings":
        """With the engine's model resolved (core.model_files.with_resolved_model) to a model called `name`:
        served under that name unless --served-model-name said otherwise (the default model, or the tiny
        one standing in for it when it cannot be had, is served under its own name)."""
        server = self.server
        if server.served_model_names == served_model_names(None, self.model):
            server = replace(server, served_model_names=(name,))
        return replace(self, engine=engine, server=server)


def settings_from(values: dict[str, object]) -> Settings:
    """Settings from checked flat values (those not given keep their fields' defaults)."""
    names, model_named = values.get("served_model_name"), values.get("model")
    server_values = values | {"served_model_name": served_model_names(
        names if isinstance(names, tuple) else None, model_named if isinstance(model_named, str) else None)}
    engine_values = {k: v for k, v in values.items() if k in _ENGINE_NAMES}
    model = str(engine_values.pop("model", None) or "")
    return Settings(engine=engine_config(model, **engine_values), server=config_from(ServerConfig, server_values))


def served_model_names(names: tuple[str, ...] | None, model: str | None) -> tuple[str, ...]:
    """As in vLLM: the --served-model-name values, else the --model argument as given (else the default model's
    name)."""
    return names or (model or DEFAULT_MODEL_NAME,)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, named, typed, defaulted and explained by its dataclass field."""
    for s in SETTINGS.values():
        flag = "--" + s.name.replace("_", "-")
        kinds = _kinds(s.type)
        help_text = s.help + _default_text(s)
        if bool in kinds:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif tuple in kinds and s.parse is None:
            parser.add_argument(flag, nargs="+", help=help_text)
        else:
            number = next((k for k in (int, float) if k in kinds), str)
            parser.add_argument(flag, type=number, choices=s.choices, help=help_text)


def load_config_file(path: str | Path) -> dict[str, object]:
    """The file's settings, checked: flat names and values of their fields' types."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"--config {path}: must hold one JSON object")
    settings = {key.replace("-", "_"): value for key, value in raw.items()}
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"--config {path}: unknown keys {unknown}; known: {sorted(SETTINGS)}")
    try:
        return {key: coerce(SETTINGS[key], value) for key, value in settings.items()}
    except ValueError as exc:
        raise ValueError(f"--config {path}: {exc}") from exc


def coerce(s: Setting, value: object) -> object:
    """`value` (from JSON or a flag) as the setting's type; raises ValueError for a value of another type."""
    kinds = _kinds(s.type)
    # A JSON object in a config file, for a setting whose parser reads one (speculative_config).
    is_parsed_object = isinstance(value, dict) and dict not in kinds
    if (isinstance(value, str) or is_parsed_object) and (parse := s.parse or _PARSERS.get(s.name)) is not None:
        value = parse(value)
    elif isinstance(value, str) and tuple in kinds:
        value = (value,)  # one name where a list of names may be given
    if isinstance(value, list) and tuple in kinds and all(isinstance(v, str) for v in value):
        value = tuple(value)
    if isinstance(value, bool):  # JSON true/false are not numbers, although bool subclasses int
        ok = bool in kinds
    elif isinstance(value, int) and float in kinds:
        value, ok = float(value), True
    else:
        ok = isinstance(value, tuple(k for k in kinds if isinstance(k, type)))
    if not ok:
        raise ValueError(f"{s.name!r} cannot be {json.dumps(value)}")
    return value  # its range and choices are the config's own checks


def _kinds(annotation: object) -> set[object]:
    """The classes a field's annotation admits: `int | None` -> {int, NoneType}, `tuple[str, ...]` -> {tuple}."""
    if get_origin(annotation) in (Union, types.UnionType):
        return set().union(*(_kinds(arg) for arg in get_args(annotation)))
    origin = get_origin(annotation)
    return {origin if origin is not None else annotation}


def _default_text(s: Setting) -> str:
    if s.default is MISSING or s.default is None:
        return ""  # the help says what no value means
    if isinstance(s.default, bool):
        return f" (default: {'on' if s.default else 'off'})"
    if isinstance(s.default, tuple):
        return f" (default: {','.join(s.default)})"
    return f" (default: {s.default})"
