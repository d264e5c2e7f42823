"""bench/constrained_step_host.py on the tiny tokenizer: both runs go through the engine with the emulated
device, the constrained run's phases are timed, and its tokens stay inside the grammar (no request fails)."""

import gc
import json
from pathlib import Path

import pytest

from bench import constrained_step_host


@pytest.mark.parametrize("freeze_gc", [False, True])
def test_constrained_step_host_run(tmp_path: Path, tiny_qwen3_dir: Path, freeze_gc: bool) -> None:
    out = tmp_path / "host.json"
    constrained_step_host.main(["--tokenizer", str(tiny_qwen3_dir), "--rows", "4", "--prompt-len", "8",
                                "--max-tokens", "12", "--out", str(out)] + ["--freeze-gc"] * freeze_gc)
    assert not gc.get_freeze_count()  # the test process's heap is collectable again
    result = json.loads(out.read_text())
    assert result["freeze_gc"] is freeze_gc
    assert all(len(r["gc_by_generation"]["ms"]) == 3 for r in result["runs"].values())
    runs = result["runs"]
    assert result["tokenizer_size"] == 512 and result["model_vocab_size"] == 151936
    assert runs["json"]["num_output_tokens"] > 0 and runs["none"]["num_output_tokens"] == 4 * 12
    assert {"grammars.fill", "postprocess", "emulator"} <= set(runs["json"]["ms_per_step"])
    assert "grammars.fill" not in runs["none"]["ms_per_step"]
    assert "error" not in runs["json"]["finish_reasons"] and sum(runs["json"]["finish_reasons"].values()) == 4
