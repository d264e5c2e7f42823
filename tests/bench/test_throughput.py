"""bench/throughput.py end to end on CPU with a tiny model: every asked-for token is generated and reported."""

import gc
import json
from pathlib import Path

from bench import throughput
from bench.bench_model import build_small_bench_model
from bench.workload import fixed_workload, total_output_tokens


def test_throughput_run_on_cpu(tmp_path: Path) -> None:
    model = build_small_bench_model(tmp_path / "model")
    out = tmp_path / "tp.json"
    throughput.main(["--model", str(model), "--device", "cpu", "--dtype", "float32", "--workload", "serve",
                     "--serve-requests", "3", "--prompt-len", "24", "--max-tokens", "6", "--kv-cache-blocks", "64",
                     "--warmup", "short", "--peer", "none", "--batch1-tokens", "4", "--profile-steps", "2",
                     "--kernels", "order_decode_rows=0+fused_sampling=0", "--out", str(out)])
    result = json.loads(out.read_text())
    ours = result["ours"]
    assert ours["num_output_tokens"] == total_output_tokens(fixed_workload(3, 24, 6)) == 18
    assert not ours["is_partial"]
    assert ours["num_prefix_hit_tokens"] == 0  # the warm-up's prompts differ from the timed run's
    assert 0 < ours["runner_seconds"] < ours["seconds"]
    assert result["summary"]["share_of_ideal"] == round(ours["tokens_per_s"] / result["ideal"]["tokens_per_s"], 4)
    assert result["batch1"]["prompt_len"] == 24 and result["batch1"]["num_output_tokens"] == 4
    assert result["batch1"]["tpot_ms"] > 0
    assert result["profile"]["full_batch_decode"]["num_running"] == 3  # past the prefills, before any request ends
    assert result["profile"]["full_batch_decode"]["top_host_ops"]
    rows = ours["step_breakdown"]
    # Every engine step launches one, but the last (async scheduling): it only collects the one before.
    assert sum(r["steps"] for r in rows) == ours["num_steps"] - 1
    assert abs(sum(r["wall_s"] for r in rows) - ours["seconds"]) < 0.05 * ours["seconds"]  # from the first launch
    assert rows[0]["category"] == "with prefill" and all(r["ideal_s"] > 0 for r in rows)
    assert result["command"].startswith("python -m bench.throughput --model")
    kernels = result["engine"]["kernels"]  # the engine's runner was built with the variant asked for
    assert not kernels["order_decode_rows"] and not kernels["fused_sampling"] and kernels["skinny_gemm"]
    # Measured with start-up's objects frozen, as in a served engine; the test process's heap collectable after.
    assert result["engine"]["frozen_objects"] > 10_000 and not gc.get_freeze_count()
