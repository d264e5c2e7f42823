"""The `auto` attention choice remembered on disk (gpu/remembered_backends.py): its key, reading and writing the
file, files unfit to trust, and a runner on the CPU that measures once, with a fake timing, and later reads the
choice back. The real timing runs on a GPU (tests/gpu/test_parity_gpu.py's `auto` runners, bench/startup_time.sh)."""

import json
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen3Config

import gpu.model_runner
from core.config import engine_config
from core.engine import runner_config
from gpu import backend_choice, remembered_backends
from gpu.model_runner import ModelRunner

SETTING = {"gpu": "NVIDIA H100 80GB HBM3", "model": {"hidden_size": 1024}, "dtype": "bfloat16", "block_size": 16,
           "max_num_seqs": 256, "candidates": ["triton", "flash-attn"], "steps": "0f"}
TIMES = {"decode": {"triton": 1.5, "flash-attn": 2.5}, "prefill": {"triton": 30.0, "flash-attn": 29.0}}


def test_the_key_holds_the_setting_the_packages_and_our_code() -> None:
    key = remembered_backends.choice_key(SETTING)
    assert {name: key[name] for name in SETTING} == SETTING
    assert set(key["versions"]) == {"torch", "triton", "flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl"}
    assert key["versions"]["torch"] is not None and len(key["code"]) == 16
    assert json.loads(json.dumps(key)) == key  # what a file gives back
    assert remembered_backends.choice_key(dict(SETTING)) == key
    other = remembered_backends.choice_key(SETTING | {"max_num_seqs": 128})
    assert remembered_backends.choice_path(Path("/c"), other) != remembered_backends.choice_path(Path("/c"), key)


def test_the_model_shape_keeps_what_shapes_the_forward_pass() -> None:
    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=300, eos_token_id=7, name_or_path="/models/a")
    shape = remembered_backends.model_shape(config)
    expected = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}
    assert {name: shape[name] for name in expected} == expected
    assert "eos_token_id" not in shape and "_name_or_path" not in shape and "torch_dtype" not in shape
    renamed = Qwen3Config(**(config.to_dict() | {"name_or_path": "/models/b", "eos_token_id": 9}))
    assert remembered_backends.model_shape(renamed) == shape


def test_a_choice_is_read_back_as_written(tmp_path: Path) -> None:
    key = remembered_backends.choice_key(SETTING)
    assert remembered_backends.recall(tmp_path, key, ["triton", "flash-attn"]) is None  # nothing yet
    written = remembered_backends.remember(tmp_path, key, "triton", "flash-attn", TIMES)
    assert written is not None and written.path == remembered_backends.choice_path(tmp_path, key)
    assert written.path.parent == tmp_path / "attention-backends"
    read = remembered_backends.recall(tmp_path, key, ["triton", "flash-attn"])
    assert read == written
    assert (read.decode, read.prefill, read.times_ms) == ("triton", "flash-attn", TIMES)
    assert [p.name for p in written.path.parent.iterdir()] == [written.path.name]  # no scratch file left


@pytest.mark.parametrize("damage", ["not json", "a field missing", "another key", "an unknown backend"])
def test_a_file_unfit_to_trust_is_measured_again(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                 damage: str) -> None:
    key = remembered_backends.choice_key(SETTING)
    path = remembered_backends.remember(tmp_path, key, "triton", "triton", TIMES).path
    data = json.loads(path.read_text())
    if damage == "not json":
        path.write_text('{"key": ')
    else:
        if damage == "a field missing":
            del data["prefill"]
        elif damage == "another key":
            data["key"] = remembered_backends.choice_key(SETTING | {"block_size": 32})
        else:
            data["decode"] = "xformers"
        path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        assert remembered_backends.recall(tmp_path, key, ["triton", "flash-attn"]) is None
    assert "measuring again" in caplog.text and str(path) in caplog.text
    assert remembered_backends.remember(tmp_path, key, "flash-attn", "triton", TIMES) is not None  # overwritten
    assert remembered_backends.recall(tmp_path, key, ["triton", "flash-attn"]).decode == "flash-attn"


def test_a_directory_that_cannot_be_written_is_no_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory would be
    key = remembered_backends.choice_key(SETTING)
    with caplog.at_level(logging.WARNING):
        assert remembered_backends.remember(blocked, key, "triton", "triton", TIMES) is None
    assert "the next start measures again" in caplog.text
    assert remembered_backends.recall(blocked, key, ["triton"]) is None


# A runner on the CPU given two candidates and a fake timing: the first start measures, later ones read the file.
# Per phase the fake gives each candidate's two steps in the order choose_phases times them: torch wins decode steps,
# cpu wins the others.
FAKE_MS = [5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0]  # decode: cpu, cpu, torch, torch; prefill: cpu, cpu, torch, torch


@pytest.fixture
def fake_timing(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    calls: list[bool] = []

    def time_forward(forward: object, is_graphed: bool) -> float:
        calls.append(is_graphed)
        return FAKE_MS[(len(calls) - 1) % len(FAKE_MS)]

    monkeypatch.setattr(gpu.model_runner, "candidate_names",
                        lambda requested, device, dtype, head_dims: (["cpu", "torch"], None))
    monkeypatch.setattr(backend_choice, "time_forward", time_forward)
    return calls


def start(model_dir: Path, cache: Path, max_num_seqs: int = 4) -> ModelRunner:
    config = runner_config(engine_config(str(model_dir), device="cpu", dtype="float32", kv_cache_blocks=64,
                                         max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=128))
    return ModelRunner(replace(config, cache_dir=str(cache)))


def test_a_runner_measures_once_and_later_runners_read_the_choice(
        tiny_qwen3_dir: Path, tmp_path: Path, fake_timing: list[bool], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu.model_runner")
    first = start(tiny_qwen3_dir, tmp_path)
    assert len(fake_timing) == len(FAKE_MS)
    assert (first.backend.decode.name, first.backend.prefill.name) == ("torch", "cpu")
    assert first.attention_times == {"decode": {"cpu": 10.0, "torch": 2.0}, "prefill": {"cpu": 2.0, "torch": 10.0}}
    (path,) = (tmp_path / "attention-backends").iterdir()
    assert f"measured now, remembered in {path}" in caplog.text

    caplog.clear()
    fake_timing.clear()
    second = start(tiny_qwen3_dir, tmp_path)
    assert not fake_timing, "the second start measured again"
    assert (second.backend.decode.name, second.backend.prefill.name) == ("torch", "cpu")
    assert second.attention_times == first.attention_times
    measured_on = json.loads(path.read_text())["measured_on"]
    assert f"decode=torch, prefill=cpu (requested auto, device cpu: read from {path}, measured on {measured_on})" \
        in caplog.text

    path.write_text("{")  # corrupt: measured again, and the file mended
    third = start(tiny_qwen3_dir, tmp_path)
    assert len(fake_timing) == len(FAKE_MS) and third.backend.name == "decode=torch, prefill=cpu"
    assert json.loads(path.read_text())["decode"] == "torch"

    start(tiny_qwen3_dir, tmp_path, max_num_seqs=2)  # another setting: its own measurement, its own file
    assert len(fake_timing) == 2 * len(FAKE_MS)
    assert len(list((tmp_path / "attention-backends").iterdir())) == 2


def test_without_a_cache_directory_every_start_measures(tiny_qwen3_dir: Path, tmp_path: Path,
                                                        fake_timing: list[bool]) -> None:
    config = runner_config(engine_config(str(tiny_qwen3_dir), device="cpu", dtype="float32", kv_cache_blocks=64,
                                         max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128))
    for _ in range(2):
        ModelRunner(replace(config, cache_dir=None))
    assert len(fake_timing) == 2 * len(FAKE_MS)


# Start-up probes' verdicts (a kernel's test product): a failure is taken from the file, a pass is probed again.
PROBE_SETTING = {"gpu": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16"}
FAILURE = "quack's gated GEMM failed on a test product (TypeError: epilogue fn depends on a ContextVar)"


class FakeProbe:
    def __init__(self, *verdicts: str | None) -> None:
        self.verdicts, self.num_calls = list(verdicts), 0

    def __call__(self) -> str | None:
        self.num_calls += 1
        return self.verdicts.pop(0)


def probe_key(tmp_path: Path, **setting: object) -> dict[str, object]:
    code = tmp_path / "probe.py"
    if not code.exists():
        code.write_text("x = 1\n")
    return remembered_backends.probe_key("gated-gemm", PROBE_SETTING | setting, (code,))


def test_a_failed_probe_is_remembered_and_not_run_again(tmp_path: Path) -> None:
    key, probe = probe_key(tmp_path), FakeProbe(FAILURE)
    reason, how = remembered_backends.probe_once(tmp_path, key, probe)
    path = remembered_backends.verdict_path(tmp_path, key)
    assert (reason, how, probe.num_calls) == (FAILURE, f"probed now, remembered in {path}", 1)
    assert path.parent == tmp_path / "probes"
    assert json.loads(path.read_text())["reason"] == FAILURE
    reason, how = remembered_backends.probe_once(tmp_path, key, probe)
    assert (reason, probe.num_calls) == (FAILURE, 1), "a remembered failure was probed again"
    assert how.startswith(f"remembered in {path}, probed on ")


def test_a_passed_probe_runs_again_and_a_new_verdict_replaces_the_file(tmp_path: Path) -> None:
    key, probe = probe_key(tmp_path), FakeProbe(None, None, FAILURE)
    assert remembered_backends.probe_once(tmp_path, key, probe)[0] is None
    path = remembered_backends.verdict_path(tmp_path, key)
    assert json.loads(path.read_text())["reason"] is None
    assert remembered_backends.probe_once(tmp_path, key, probe) == (None, "probed now")  # it builds the kernel too
    assert remembered_backends.probe_once(tmp_path, key, probe)[0] == FAILURE
    assert probe.num_calls == 3 and remembered_backends.recall_verdict(tmp_path, key).reason == FAILURE


def test_a_verdict_is_kept_per_gpu_dtype_packages_and_probe_code(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    key, probe = probe_key(tmp_path), FakeProbe(FAILURE, None, None, None)
    remembered_backends.probe_once(tmp_path, key, probe)
    assert key["probe"] == "gated-gemm" and set(key["versions"]) == set(remembered_backends.PACKAGES)
    remembered_backends.probe_once(tmp_path, probe_key(tmp_path, dtype="float16"), probe)
    (tmp_path / "probe.py").write_text("x = 2\n")  # the probe's code changed
    remembered_backends.probe_once(tmp_path, probe_key(tmp_path), probe)
    monkeypatch.setattr(remembered_backends, "package_versions", lambda: {"nvidia-cutlass-dsl": "4.7.1"})
    remembered_backends.probe_once(tmp_path, probe_key(tmp_path), probe)
    assert probe.num_calls == 4 and len(list((tmp_path / "probes").iterdir())) == 4


@pytest.mark.parametrize("damage", ["not json", "a field missing", "another key", "a reason that is no text"])
def test_a_verdict_unfit_to_trust_is_probed_again(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                  damage: str) -> None:
    key = probe_key(tmp_path)
    path = remembered_backends.remember_verdict(tmp_path, key, FAILURE).path
    data = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("[")
    else:
        if damage == "a field missing":
            del data["reason"]
        elif damage == "another key":
            data["key"] = probe_key(tmp_path, dtype="float16")
        else:
            data["reason"] = 3
        path.write_text(json.dumps(data))
    probe = FakeProbe(None)
    with caplog.at_level(logging.WARNING):
        assert remembered_backends.probe_once(tmp_path, key, probe) == (None, f"probed now, remembered in {path}")
    assert probe.num_calls == 1 and "probe gated-gemm" in caplog.text and str(path) in caplog.text
    assert remembered_backends.recall_verdict(tmp_path, key).reason is None  # mended


def test_without_a_cache_directory_every_start_probes(tmp_path: Path) -> None:
    probe = FakeProbe(FAILURE, FAILURE)
    for _ in range(2):
        assert remembered_backends.probe_once(None, probe_key(tmp_path), probe) == (FAILURE, "probed now")
    assert probe.num_calls == 2 and not (tmp_path / "probes").exists()


def test_a_gpu_runner_takes_a_remembered_gated_gemm_failure_unprobed(
    tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The runner's wiring, its GPU faked: the first start probes and remembers, the second logs the file; the same
    packages installed elsewhere are probed again."""
    probe, installed_at = FakeProbe(FAILURE, None), {"cutlass": "/tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass"}
    monkeypatch.setattr(gpu.model_runner.gated_gemm, "install_locations", lambda: dict(installed_at))
    monkeypatch.setattr(gpu.model_runner.gated_gemm, "requirement_unmet", lambda device, dtype: None)
    monkeypatch.setattr(gpu.model_runner.gated_gemm, "probe", lambda device, dtype: probe())
    monkeypatch.setattr(gpu.model_runner.torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    config = replace(runner_config(engine_config(str(tiny_qwen3_dir), device="cpu")), cache_dir=str(tmp_path))
    runner = SimpleNamespace(config=config, device=torch.device("cuda", 0), dtype=torch.bfloat16)
    caplog.set_level(logging.INFO, logger="gpu.model_runner")
    for _ in range(2):
        ModelRunner._probe_gated_gemm(runner)  # type: ignore[arg-type]
    (path,) = (tmp_path / "probes").iterdir()
    assert probe.num_calls == 1
    first, second = [r.getMessage() for r in caplog.records if "gated GEMM off" in r.getMessage()]
    assert first == f"gated GEMM off: {FAILURE} (probed now, remembered in {path})"
    assert second.startswith(f"gated GEMM off: {FAILURE} (remembered in {path}, probed on ")
    installed_at["cutlass"] = "/opt/venv/lib/python3.12/site-packages/nvidia_cutlass_dsl/dsl_packages/cutlass"
    ModelRunner._probe_gated_gemm(runner)  # type: ignore[arg-type]
    assert probe.num_calls == 2 and len(list((tmp_path / "probes").iterdir())) == 2
    assert caplog.records[-1].getMessage().startswith("gate/up products of 512+ rows compute SiLU-and-mul in their "
                                                      "epilogue (quack's gated GEMM; probed now, remembered in ")
