"""bench/startup_time.py: openai-serve started twice in a row on the CPU (the tiny model), each start's seconds to
/health and the attention choice read from its log; and the line it reads, as the runner writes it."""

import json
from pathlib import Path

from bench import startup_time


def test_the_choice_line_as_the_runner_logs_it() -> None:
    log = ("2026-01-01 00:00:00,000 INFO gpu.model_runner [engine]: attention backend: decode=triton, "
           "prefill=flash-attn (requested auto, device cuda: read from /c/attention-backends/ab.json, measured on "
           "2026-01-01)\n"
           "2026-01-01 00:00:01,000 INFO gpu.model_runner [engine]: CUDA graph capture took 1.0 s\n")
    found = startup_time.CHOICE.search(log)
    assert found is not None and found["names"] == "decode=triton, prefill=flash-attn"
    assert found["why"] == "read from /c/attention-backends/ab.json, measured on 2026-01-01"


def test_two_starts_of_the_tiny_model_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    startup_time.main(["--server-args", "--model tiny --device cpu", "--cache-dir", str(tmp_path / "cache"),
                       "--log-dir", str(tmp_path), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["kind"] == "startup-time"
    assert [s["attention_backend"] for s in result["starts"]] == ["cpu", "cpu"]
    assert [s["why"] for s in result["starts"]] == ["the only candidate"] * 2
    assert all(0 < s["seconds_to_health"] < 600 for s in result["starts"])
    assert "--download-dir " + str(tmp_path / "cache") in result["command"]
