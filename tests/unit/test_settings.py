"""Settings for the CLI: defaults, then a --config JSON file, then flags; shipped configs are valid.
Flags, file keys, defaults and help come from the config dataclasses' fields, and `LLM(...)` takes
the same names."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from core.config import CacheConfig, ModelConfig, SchedulerConfig, engine_config
from openai_serve import __version__
from openai_serve.cli import build_parser, parse_settings
from openai_serve.server_config import ServerConfig, parse_origins
from openai_serve.settings import DEFAULT_MODEL_NAME, SETTINGS, load_config_file, served_model_names

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.json"))


def write(tmp_path: Path, settings: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(settings))
    return str(path)


def test_flags_override_the_file_which_overrides_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, {"port": 9001, "max-model-len": 256, "block_size": 32})
    settings = parse_settings(["--config", path, "--port", "9002", "--no-enable-prefix-caching"])
    engine, server = settings.engine, settings.server
    assert server.port == 9002 and engine.model.max_model_len == 256 and engine.cache.block_size == 32
    assert engine.cache.enable_prefix_caching is False and server.host == "127.0.0.1"


@pytest.mark.parametrize("bad", [{"prot": 1}, {"port": "8000"}, {"enforce-eager": 1}, {"max-num-seqs": True},
                                 {"served-model-name": 5}])
def test_bad_config_files_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError, match="--config"):
        load_config_file(write(tmp_path, bad))
    with pytest.raises(SystemExit):
        parse_settings(["--config", write(tmp_path, bad)])


def test_api_key_from_environment_only_when_no_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_SERVE_API_KEY", "from-env")
    assert parse_settings([]).server.api_key == "from-env"
    assert parse_settings(["--api-key", "from-flag"]).server.api_key == "from-flag"
    monkeypatch.delenv("OPENAI_SERVE_API_KEY")
    assert parse_settings([]).server.api_key is None


def test_served_model_names_follow_vllm() -> None:
    assert served_model_names(None, None) == (DEFAULT_MODEL_NAME,)
    assert served_model_names(None, "Qwen/Qwen3-0.6B") == ("Qwen/Qwen3-0.6B",)
    assert served_model_names(("a", "b"), "x") == ("a", "b")
    assert parse_settings(["--served-model-name", "a", "b"]).server.served_model_names == ("a", "b")
    assert parse_settings(["/models/x"]).server.served_model_names == ("/models/x",)


def test_allowed_origins_spellings(tmp_path: Path) -> None:
    assert parse_origins('["http://a", "http://b"]') == ("http://a", "http://b")
    assert parse_origins("http://a, http://b") == ("http://a", "http://b")
    assert parse_origins("") == ()
    assert parse_settings(["--allowed-origins", ""]).server.allowed_origins == ()
    path = write(tmp_path, {"allowed-origins": ["http://a"]})
    assert parse_settings(["--config", path]).server.allowed_origins == ("http://a",)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_build_valid_configs(path: Path) -> None:
    settings = parse_settings(["--config", str(path)])
    assert settings.engine.cache.block_size >= 1 and settings.server.served_model_names


def test_there_are_shipped_configs() -> None:
    assert len(CONFIGS) >= 2


def test_scheduling_and_interpreter_lock_settings_reach_the_configs(capsys: pytest.CaptureFixture[str]) -> None:
    defaults = parse_settings([])
    assert defaults.engine.scheduler.async_scheduling is True
    assert defaults.server.gil_switch_interval_ms == 5.0
    assert defaults.server.engine_process is True
    assert parse_settings(["--no-engine-process"]).server.engine_process is False
    settings = parse_settings(["--no-async-scheduling", "--gil-switch-interval-ms", "0.5"])
    assert settings.engine.scheduler.async_scheduling is False
    assert settings.server.gil_switch_interval_ms == 0.5
    with pytest.raises(SystemExit):
        parse_settings(["--gil-switch-interval-ms", "0"])
    assert "gil_switch_interval_ms" in capsys.readouterr().err


def test_the_configs_own_checks_refuse_a_file_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--config", write(tmp_path, {"dtype": "float8"})])
    assert "dtype must be one of auto, float32, bfloat16, float16" in capsys.readouterr().err


def test_model_as_positional_argument_or_flag() -> None:
    assert parse_settings(["/models/x"]).model == "/models/x"
    assert parse_settings(["--model", "/models/x"]).model == "/models/x"
    assert parse_settings(["/models/x", "--model", "/models/x", "--port", "1"]).model == "/models/x"
    assert parse_settings([]).model is None
    with pytest.raises(SystemExit):
        parse_settings(["/models/x", "--model", "/models/y"])


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"openai-serve {__version__}"


def test_every_config_field_is_a_flag_a_file_key_and_an_llm_keyword_with_its_default() -> None:
    """One source: no field of the configs is missing from the command line, and nothing else is on it."""
    config_fields = [f for cls in (ModelConfig, CacheConfig, SchedulerConfig, ServerConfig) for f in fields(cls)]
    assert len(SETTINGS) == len(config_fields)
    help_text = build_parser().format_help()
    for s in SETTINGS.values():
        assert "--" + s.name.replace("_", "-") in help_text
    assert "--kv-cache-blocks" in help_text and "(default: 8192)" in help_text  # a renamed field; a default
    config = engine_config("m", max_num_seqs=3, kv_cache_blocks=7, dtype="float32", enforce_eager=True)
    assert (config.scheduler.max_num_seqs, config.cache.num_blocks, config.model.dtype) == (3, 7, "float32")
    assert config.scheduler.max_num_batched_tokens == SchedulerConfig().max_num_batched_tokens
    with pytest.raises(TypeError, match="max_num_seq"):
        engine_config("m", max_num_seq=3)


def test_the_resolved_model_is_served_under_its_name_unless_named_otherwise() -> None:
    default = parse_settings([])
    assert default.server.served_model_names == ("smollm2-135m-instruct",)
    stand_in = default.with_model(default.engine, "openai-serve-tiny")  # the default could not be had
    assert stand_in.server.served_model_names == ("openai-serve-tiny",)
    named = parse_settings(["--served-model-name", "x"])
    assert named.with_model(named.engine, "openai-serve-tiny").server.served_model_names == ("x",)
