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


def test_the_gated_gemm_line_as_the_runner_logs_it() -> None:
    off = ("gated GEMM off: quack's gated GEMM failed on a test product (TypeError: epilogue fn depends on x) "
           "(remembered in /c/probes/cd.json, probed on 2026-01-01)")
    on = "gate/up products of 512+ rows compute SiLU-and-mul in their epilogue (quack's gated GEMM; probed now)"
    for line in (off, on):
        log = f"2026-01-01 00:00:00,000 INFO gpu.model_runner [engine]: {line}\nINFO: Started server process [1]\n"
        assert startup_time.GATED_GEMM.search(log)["line"] == line
    assert startup_time.GATED_GEMM.search("attention backend: triton (requested auto, device cuda: one)") is None


def test_two_starts_of_the_tiny_model_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    startup_time.main(["--server-args", "--model tiny --device cpu", "--cache-dir", str(tmp_path / "cache"),
                       "--log-dir", str(tmp_path), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["kind"] == "startup-time"
    assert [s["attention_backend"] for s in result["starts"]] == ["cpu", "cpu"]
    assert [s["why"] for s in result["starts"]] == ["the only candidate"] * 2
    assert [s["gated_gemm"] for s in result["starts"]] == [None, None]  # a CPU has none
    assert all(0 < s["seconds_to_health"] < 600 for s in result["starts"])
    assert "--download-dir " + str(tmp_path / "cache") in result["command"]
