"""Default sampling from a model's generation_config.json (core/sampling_defaults.py), as vLLM's
`--generation-config` takes it, and how a request's fields meet it (protocol/common.py, generation.py)."""

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from core import ModelConfig
from core.sampling_defaults import SERVER_DEFAULTS, fill_max_tokens, load_sampling_defaults
from core.sampling_params import SamplingParams
from openai_serve.cli import parse_settings
from openai_serve.errors import APIError
from openai_serve.protocol.chat import parse_chat_request
from openai_serve.protocol.completions import parse_completion_request
from openai_serve.protocol.responses import parse_responses_request

QWEN3_LIKE = {"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": True, "temperature": 0.6, "top_k": 20,
              "top_p": 0.95, "max_new_tokens": 300, "transformers_version": "4.51.0"}


def defaults(**values: object) -> SamplingParams:
    return replace(SERVER_DEFAULTS, **values)


MODEL_DEFAULTS = defaults(temperature=0.6, top_p=0.95, top_k=20, max_tokens=300)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def checkpoint(folder: Path, generation_config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


def test_auto_reads_the_models_values_and_logs_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="core.sampling_defaults"):
        defaults = load_sampling_defaults(str(checkpoint(tmp_path, QWEN3_LIKE)))
    assert defaults == MODEL_DEFAULTS
    assert "Default sampling parameters have been overridden by the generation config" in caplog.text
    assert "temperature=0.6, top_p=0.95, top_k=20, max_tokens=300" in caplog.text


def test_a_model_that_states_none_gets_the_servers_own(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="core.sampling_defaults"):
        assert load_sampling_defaults(str(checkpoint(tmp_path, {"eos_token_id": 2}))) == SERVER_DEFAULTS
        assert load_sampling_defaults(str(tmp_path / "no-such-file")) == SERVER_DEFAULTS
    assert "the server's own" in caplog.text and "overridden" not in caplog.text


def test_vllm_ignores_the_file_a_folder_replaces_it_and_overrides_go_over_either(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", QWEN3_LIKE)
    other = checkpoint(tmp_path / "other", {"temperature": 0.3, "min_p": 0.05, "repetition_penalty": 1.1})
    assert load_sampling_defaults(str(model), "vllm") == SERVER_DEFAULTS
    assert load_sampling_defaults(str(model), str(other)) == defaults(temperature=0.3, min_p=0.05,
                                                                              repetition_penalty=1.1)
    assert load_sampling_defaults(str(model), "vllm", {"temperature": 0.5}) == defaults(temperature=0.5)
    assert load_sampling_defaults(str(model), "auto", {"top_k": 0, "max_new_tokens": 8}) == defaults(
        temperature=0.6, top_p=0.95, max_tokens=8)  # HF's top_k 0: no top-k


@pytest.mark.parametrize(("values", "message"), [
    ({"top_p": 0}, "'top_p' must be in (0.0, 1.0]"),
    ({"temperature": -1}, "'temperature' must be >= 0.0"),
    ({"max_new_tokens": 0}, "'max_new_tokens' must be >= 1"),
    ({"top_k": 2.5}, "'top_k' must be an integer"),
    ({"temperature": "hot"}, "'temperature' must be a number"),
    ({"repetition_penalty": True}, "'repetition_penalty' must be a number"),
])
def test_a_value_that_cannot_be_used_is_an_error_naming_the_file_and_key(tmp_path: Path, values: dict[str, object],
                                                                          message: str) -> None:
    model = checkpoint(tmp_path, values)
    with pytest.raises(ValueError, match=r"generation_config\.json \(--generation-config vllm ignores it\)") as error:
        load_sampling_defaults(str(model))
    assert message in str(error.value)


def test_a_folder_without_the_file_and_a_file_without_json_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="there is no"):
        load_sampling_defaults(str(tmp_path), str(tmp_path / "elsewhere"))
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json"):
        load_sampling_defaults(str(tmp_path))


def test_the_flags_come_from_the_model_config() -> None:
    settings = parse_settings(["--generation-config", "vllm", "--override-generation-config",
                               '{"temperature": 0.4, "max_new_tokens": 64}'])
    assert settings.engine.model.generation_config == "vllm"
    assert settings.engine.model.override_generation_config == {"temperature": 0.4, "max_new_tokens": 64}
    assert parse_settings([]).engine.model.generation_config == "auto"
    for bad in ('{"temprature": 0.4}', '{"top_p": 2}', "[1]", "not json"):
        with pytest.raises(SystemExit):
            parse_settings(["--override-generation-config", bad])
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig(model="m", override_generation_config={"seed": 1})


def test_fields_left_out_take_the_defaults_and_fields_sent_win() -> None:
    absent = parse_chat_request(CHAT, defaults=MODEL_DEFAULTS).common.sampling
    assert (absent.temperature, absent.top_p, absent.top_k, absent.min_p) == (0.6, 0.95, 20, 0.0)
    nulls = parse_chat_request(CHAT | {"temperature": None, "top_k": None}, defaults=MODEL_DEFAULTS).common.sampling
    assert (nulls.temperature, nulls.top_k) == (0.6, 20)  # null is "the default", as in OpenAI's API
    sent = parse_chat_request(CHAT | {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.1,
                                      "repetition_penalty": 1.2, "max_tokens": 7}, defaults=MODEL_DEFAULTS)
    s = sent.common.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty, s.max_tokens) == (0, 1, None, 0.1, 1.2, 7)
    assert parse_chat_request(CHAT).common.sampling.temperature == 1.0  # no defaults given: the server's own


def test_every_route_takes_them() -> None:
    completion = parse_completion_request({"model": "m", "prompt": "x"}, defaults=MODEL_DEFAULTS).common.sampling
    response = parse_responses_request({"model": "m", "input": "x"}, defaults=MODEL_DEFAULTS).common.sampling
    for sampling in (completion, response):
        assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 0.95, 20)
    # max_tokens left out stays None until the prompt's length is known (fill_max_tokens)...
    assert completion.max_tokens is None and response.max_tokens is None
    # ...but for completions only where the model has one: OpenAI's 16 otherwise.
    assert parse_completion_request({"model": "m", "prompt": "x"}).common.sampling.max_tokens == 16


def test_the_default_max_tokens_fits_what_the_prompt_leaves() -> None:
    absent = parse_chat_request(CHAT, defaults=MODEL_DEFAULTS).common.sampling
    assert fill_max_tokens(absent, MODEL_DEFAULTS, room=1000).max_tokens == 300
    assert fill_max_tokens(absent, MODEL_DEFAULTS, room=120).max_tokens == 120  # never a reason to refuse
    sent = parse_chat_request(CHAT | {"max_tokens": 500}, defaults=MODEL_DEFAULTS).common.sampling
    assert fill_max_tokens(sent, MODEL_DEFAULTS, room=120).max_tokens == 500  # the request's own: checked as sent
    assert fill_max_tokens(absent, SERVER_DEFAULTS, room=120).max_tokens is None  # the rest of the context


def test_a_request_value_is_checked_as_before_whatever_the_defaults() -> None:
    with pytest.raises(APIError) as error:
        parse_chat_request(CHAT | {"top_p": 0}, defaults=MODEL_DEFAULTS)
    assert error.value.param == "top_p"
