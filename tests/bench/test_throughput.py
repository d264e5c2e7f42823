"""bench/throughput.py end to end on CPU with a tiny model: every asked-for token is generated and reported, each
headline figure beside its share of the ideal."""

import gc
import json
from pathlib import Path

from bench import throughput
from bench.roofline import ModelShape
from bench.workload import fixed_workload


def test_throughput_run_on_cpu(tmp_path: Path, tiny_bench_model: Path) -> None:
    model = tiny_bench_model
    out = tmp_path / "tp.json"
    throughput.main(["--model", str(model), "--device", "cpu", "--dtype", "float32", "--workload", "serve",
                     "--serve-requests", "3", "--prompt-len", "24", "--max-tokens", "6", "--kv-cache-blocks", "64",
                     "--warmup", "short", "--batch1-tokens", "4", "--out", str(out)])
    result = json.loads(out.read_text())
    ours, summary = result["ours"], result["summary"]
    assert ours["num_output_tokens"] == sum(r.max_tokens for r in fixed_workload(3, 24, 6)) == 18
    assert not ours["is_partial"]
    assert ours["num_prefix_hit_tokens"] == 0  # the warm-up's prompts differ from the timed run's
    assert summary["share_of_ideal"] == round(ours["tokens_per_s"] / result["ideal"]["tokens_per_s"], 4)
    assert result["batch1"]["prompt_len"] == 24 and result["batch1"]["num_output_tokens"] == 4
    assert summary["batch1_share_of_ideal"] == round(result["ideal"]["batch1_tpot_ms"] / result["batch1"]["tpot_ms"], 4)
    assert result["command"].startswith("python -m bench.throughput --model")
    # Measured with start-up's objects frozen, as in a served engine; the test process's heap collectable after.
    assert result["engine"]["frozen_objects"] > 10_000 and not gc.get_freeze_count()


def test_an_moe_shape_from_its_config_alone(tmp_path: Path) -> None:
    """--load-format dummy: config.json and the tokenizer written, the weights drawn by the engine; the ideal counts
    the routed experts a step reaches (all of them at a batch's many rows, k / E of them at batch 1)."""
    out = tmp_path / "moe.json"
    throughput.main(["--shape", "tiny-moe", "--load-format", "dummy", "--device", "cpu", "--dtype", "float32",
                     "--workload", "serve", "--serve-requests", "4", "--prompt-len", "16", "--max-tokens", "4",
                     "--kv-cache-blocks", "64", "--warmup", "none", "--batch1-tokens", "3", "--out", str(out)])
    result = json.loads(out.read_text())
    model = Path(result["model"])
    assert not list(model.glob("*.safetensors")) and (model / "tokenizer.json").exists()
    assert result["ours"]["num_output_tokens"] == 16 and result["config"]["load_format"] == "dummy"
    shape = ModelShape.from_dir(model, 4)
    assert shape.num_experts == 8 and shape.expert_bytes == 2 * 8 * 3 * 64 * 64 * 4  # two layers, float32
    assert shape.weight_bytes(1) == shape.dense_bytes + shape.expert_bytes * 2 / 8
    assert result["summary"]["batch1_share_of_ideal"] > 0
