"""bench/sampling_cost.py end to end on CPU with the tiny model: the three runs generate the same tokens per
request, the json run's outputs that ended by EOS parse, and the report says so."""

import json
from pathlib import Path

from bench import sampling_cost


def test_sampling_cost_run_on_cpu(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    out = tmp_path / "cost.json"
    sampling_cost.main(["--model", str(tiny_qwen3_dir), "--tokenizer", str(tiny_qwen3_dir),
                        "--model-dir", str(tmp_path / "model"), "--device", "cpu", "--dtype", "float32",
                        "--num-requests", "4", "--prompt-len", "8", "--max-tokens", "24", "--warmup-requests", "1",
                        "--max-num-seqs", "4", "--kv-cache-blocks", "32", "--max-model-len", "256", "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert runs["json"]["num_output_tokens"] == runs["none"]["num_output_tokens"] == \
        runs["penalties"]["num_output_tokens"] > 0
    assert runs["none"]["vs_none"] == 1.0 and runs["penalties"]["vs_none"] > 0
    stopped = runs["json"]["finish_reasons"].get("stop", 0)
    assert runs["json"]["validity"].get("valid", 0) >= stopped
    assert set(runs["none"]["finish_reasons"]) == {"length"}
