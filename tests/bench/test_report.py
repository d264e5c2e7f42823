"""The performance page's tables, rendered from sample results between their markers: the latest run wins, a figure
of several runs shows their range, the server's share pairs each run with the offline run just before it, every
table lists its sources; the hand-written prose around the tables is kept; and the committed page is up to date."""

import json
from pathlib import Path

import pytest

from bench.report import load_results, render

ROOT = Path(__file__).parents[2]
DEVICE = "NVIDIA H100 80GB HBM3"
PAGE = """# Performance

Prose before.

<!-- table: offline -->
stale rows
<!-- end -->

Prose between.

<!-- table: serving -->
<!-- end -->
"""


def _provenance(date: str) -> dict[str, object]:
    return {"device": DEVICE, "date": date, "commit": "abc1234", "command": "python -m bench.x"}


def _throughput(date: str, tokens_per_s: float, workload: str = "nano-vllm", gpus: int = 1) -> dict[str, object]:
    return {**_provenance(date), "kind": "throughput", "workload": workload, "model": "/tmp/bench-models/qwen3-0.6b",
            "config": {"tensor_parallel_size": gpus}, "ideal": {"tokens_per_s": 20_000.0, "batch1_tpot_ms": 0.5},
            "ours": {"tokens_per_s": tokens_per_s}, "batch1": {"tpot_ms": 1.0},
            "summary": {"share_of_ideal": tokens_per_s / 20_000.0}}


def _level(concurrency: int, tokens_per_s: float, ttft_p50: float, failed: int = 0) -> dict[str, object]:
    return {"concurrency": concurrency, "num_failed": failed, "output_tokens_per_s": tokens_per_s,
            "ttft_ms": {"p50": ttft_p50, "p99": 40.0}, "tpot_ms": {"p50": 1.5, "p99": 2.0}}


def _serve(label: str, date: str, levels: list[dict[str, object]]) -> dict[str, object]:
    return {**_provenance(date), "kind": "serve", "server": {"label": label}, "levels": levels}


def _write(results: Path, name: str, result: dict[str, object]) -> None:
    results.mkdir(exist_ok=True)
    (results / name).write_text(json.dumps(result))


def test_tables_are_rendered_between_their_markers_from_the_latest_runs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _write(results, "old.json", _throughput("2026-11-20 10:00 UTC", 9_999.0))
    _write(results, "new.json", _throughput("2026-11-21 10:00 UTC", 16_000.0))
    _write(results, "two-gpus.json", _throughput("2026-11-19 10:00 UTC", 30_000.0, gpus=2))
    _write(results, "offline-serve-1.json", _throughput("2026-11-21 10:05 UTC", 10_000.0, workload="serve"))
    _write(results, "ours-1.json", _serve("openai-serve", "2026-11-21 11:00 UTC",
                                          [_level(1, 150.0, 30.0), _level(256, 8_000.0, 900.0)]))
    _write(results, "offline-serve-2.json", _throughput("2026-11-21 12:00 UTC", 12_000.0, workload="serve"))
    _write(results, "ours-2.json", _serve("openai-serve", "2026-11-21 12:05 UTC", [_level(256, 13_200.0, 700.0)]))
    _write(results, "hf.json", _serve("transformers serve", "2026-11-21 11:30 UTC", [_level(1, 50.0, 80.0, 2)]))

    page = render(PAGE, load_results(results))

    assert page.startswith("# Performance\n\nProse before.\n\n<!-- table: offline -->\n| model")
    assert "Prose between." in page and "stale rows" not in page and page.count("<!-- end -->") == 2
    offline = page[page.index("table: offline"):page.index("Prose between.")]
    assert "| qwen3-0.6b | NVIDIA H100 80GB HBM3 | 1 | 16,000 | 80.0% | 1.000 | 50% |" in offline
    assert "| qwen3-0.6b | NVIDIA H100 80GB HBM3 | 2 | 30,000 | 150.0% |" in offline  # its own row: two GPUs
    assert "9,999" not in offline and "- `new.json`: NVIDIA H100 80GB HBM3, 2026-11-21 10:00 UTC, commit " \
        "`abc1234`: `python -m bench.x`" in offline and "old.json" not in offline
    serving = page[page.index("table: serving"):]
    # Two runs at 256: 8,000 of the 10,000 measured just before it, and 13,200 of 12,000.
    assert "| openai-serve | 256 | 2 | 8,000-13,200 | 80.0-110.0% | 700.0-900.0 | 40.0 | 1.50 | 0 |" in serving
    assert "| openai-serve | 1 | 1 | 150 | - | 30.0 |" in serving
    assert serving.index("| openai-serve |") < serving.index("| transformers serve | 1 | 1 | 50 | - | 80.0 |")
    assert "`offline-serve-1.json`" in serving and "`offline-serve-2.json`" in serving


def test_a_table_nobody_renders_is_an_error() -> None:
    with pytest.raises(ValueError, match="no table named 'nonsense'"):
        render("<!-- table: nonsense -->\n<!-- end -->\n", [])


def test_the_committed_page_is_rendered_from_the_committed_results() -> None:
    page = (ROOT / "docs/performance.md").read_text()
    assert render(page, load_results(ROOT / "bench/results")) == page, "run `python -m bench.report` and commit"


def test_the_default_model_table_names_the_cpu_and_the_kernels_a_contender_ran(tmp_path: Path) -> None:
    run = {"device": "CPU (x86_64, 2 cores)", "date": "2026-11-21 10:00 UTC", "commit": "abc1234",
           "command": "python -m bench.default_model_speed", "kind": "default-model-speed", "threads": 2,
           "cpu": {"model": "AMD EPYC", "flags": ["avx2", "avx512_vnni"]},
           "openmp_environment": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
           "results": {"openai-serve auto (float32)": {"decode_tok_s": [150.0, 160.0], "decode_tok_s_median": 155.0,
                                                       "request_tok_s_median": 140.0,
                                                       "request_cpu_ms_per_token_median": 6.5,
                                                       "cpu_kernels": {"int8_dot": "avx512-vnni"}},
                       "llama.cpp (model.gguf)": {"decode_tok_s": [100.0], "decode_tok_s_median": 100.0,
                                                  "request_tok_s_median": 90.0}}}
    _write(tmp_path / "results", "cpu.json", run)
    page = render("<!-- table: default-model -->\n<!-- end -->\n", load_results(tmp_path / "results"))
    device = "CPU (x86_64, 2 cores), AMD EPYC, 2 threads, OMP_WAIT_POLICY=PASSIVE"
    assert (f"| {device} | smollm2-135m-instruct | openai-serve auto (float32), int8 dot products (avx512-vnni) | "
            "155.0 | 150.0, 160.0 | 140.0 | 6.5 |" in page)
    assert f"| {device} | smollm2-135m-instruct | llama.cpp (model.gguf) | 100.0 | 100.0 | 90.0 | - |" in page


def test_a_run_on_another_prompt_set_names_it_beside_the_model(tmp_path: Path) -> None:
    run = {**_provenance("2026-11-21 10:00 UTC"), "kind": "default-model-speed", "model_name": "smollm2-135m-instruct",
           "prompts": "code_edit", "results": {"openai-serve bfloat16 (bfloat16), speculative ngram": {
               "decode_tok_s": [300.0], "decode_tok_s_median": 300.0, "request_tok_s_median": 250.0}}}
    _write(tmp_path / "results", "speculative.json", run)
    page = render("<!-- table: default-model -->\n<!-- end -->\n", load_results(tmp_path / "results"))
    assert (f"| {DEVICE} | smollm2-135m-instruct, code_edit | openai-serve bfloat16 (bfloat16), speculative ngram | "
            "300.0 | 300.0 | 250.0 | - |" in page)
