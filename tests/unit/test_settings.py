"""Settings for the CLI: defaults, then a --config JSON file, then flags; shipped configs are valid."""

import json
from pathlib import Path

import pytest

from openai_serve import __version__
from openai_serve.cli import parse_settings
from openai_serve.settings import (
    BUILTIN_MODEL_NAME,
    engine_config,
    load_config_file,
    parse_origins,
    served_model_names,
    server_config,
)

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.json"))


def write(tmp_path: Path, settings: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(settings))
    return str(path)


def test_flags_override_the_file_which_overrides_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, {"port": 9001, "max-model-len": 256, "block_size": 32})
    settings = parse_settings(["--config", path, "--port", "9002", "--no-enable-prefix-caching"])
    assert settings["port"] == 9002 and settings["max_model_len"] == 256 and settings["block_size"] == 32
    assert settings["enable_prefix_caching"] is False and settings["host"] == "127.0.0.1"


@pytest.mark.parametrize("bad", [{"prot": 1}, {"port": "8000"}, {"enforce-eager": 1}, {"max-num-seqs": True},
                                 {"served-model-name": 5}])
def test_bad_config_files_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError, match="--config"):
        load_config_file(write(tmp_path, bad))
    with pytest.raises(SystemExit):
        parse_settings(["--config", write(tmp_path, bad)])


def test_api_key_from_environment_only_when_no_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_SERVE_API_KEY", "from-env")
    assert parse_settings([])["api_key"] == "from-env"
    assert parse_settings(["--api-key", "from-flag"])["api_key"] == "from-flag"
    monkeypatch.delenv("OPENAI_SERVE_API_KEY")
    assert parse_settings([])["api_key"] is None


def test_served_model_names_follow_vllm() -> None:
    assert served_model_names({"served_model_name": None, "model": None}) == (BUILTIN_MODEL_NAME,)
    assert served_model_names({"served_model_name": None, "model": "Qwen/Qwen3-0.6B"}) == ("Qwen/Qwen3-0.6B",)
    assert served_model_names({"served_model_name": ["a", "b"], "model": "x"}) == ("a", "b")
    assert parse_settings(["--served-model-name", "a", "b"])["served_model_name"] == ["a", "b"]


def test_allowed_origins_spellings() -> None:
    assert parse_origins('["http://a", "http://b"]') == ["http://a", "http://b"]
    assert parse_origins("http://a, http://b") == ["http://a", "http://b"]
    assert parse_origins("") == [] and parse_origins(["*"]) == ["*"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_build_valid_configs(path: Path) -> None:
    settings = parse_settings(["--config", str(path)])
    engine = engine_config(settings, "/models/any")
    server = server_config(settings, chat_template=None)
    assert engine.cache.block_size >= 1 and server.served_model_names


def test_there_are_shipped_configs() -> None:
    assert len(CONFIGS) >= 2


def test_scheduling_and_interpreter_lock_settings_reach_the_configs() -> None:
    defaults = parse_settings([])
    assert engine_config(defaults, "m").scheduler.async_scheduling is True
    assert server_config(defaults, None).gil_switch_interval_ms == 5.0
    assert defaults["engine_process"] is True and parse_settings(["--no-engine-process"])["engine_process"] is False
    settings = parse_settings(["--no-async-scheduling", "--gil-switch-interval-ms", "0.5"])
    assert engine_config(settings, "m").scheduler.async_scheduling is False
    assert server_config(settings, None).gil_switch_interval_ms == 0.5
    with pytest.raises(ValueError, match="gil_switch_interval_ms"):
        server_config(parse_settings(["--gil-switch-interval-ms", "0"]), None)


def test_model_as_positional_argument_or_flag() -> None:
    assert parse_settings(["/models/x"])["model"] == "/models/x"
    assert parse_settings(["--model", "/models/x"])["model"] == "/models/x"
    assert parse_settings(["/models/x", "--model", "/models/x", "--port", "1"])["model"] == "/models/x"
    with pytest.raises(SystemExit):
        parse_settings(["/models/x", "--model", "/models/y"])


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"openai-serve {__version__}"
