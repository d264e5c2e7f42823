"""bench/sampling_cost.py end to end on CPU with the tiny model: the three runs generate the same tokens per
request, the json run's outputs that ended by EOS parse, and the report says so."""

import json
import re
from pathlib import Path

from bench import sampling_cost
from bench.engine_runs import build_timed_engine
from core import SamplingParams
from core.config import engine_config
from core.structured_output import StructuredOutput
from core.tokenizer import load_tokenizer
from gpu.config import KernelConfig


def test_sampling_cost_run_on_cpu(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    out = tmp_path / "cost.json"
    sampling_cost.main(["--model", str(tiny_qwen3_dir), "--tokenizer", str(tiny_qwen3_dir),
                        "--model-dir", str(tmp_path / "model"), "--device", "cpu", "--dtype", "float32",
                        "--num-requests", "4", "--prompt-len", "8", "--max-tokens", "24", "--warmup-requests", "1",
                        "--max-num-seqs", "4", "--kv-cache-blocks", "32", "--max-model-len", "256",
                        "--kernels", "fused_logit_adjustments=0", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["kernels"]["fused_logit_adjustments"] is False and result["kernels"]["fused_sampling"] is True
    runs = result["runs"]
    assert runs["json"]["num_output_tokens"] == runs["none"]["num_output_tokens"] == \
        runs["penalties"]["num_output_tokens"] > 0
    assert runs["none"]["vs_none"] == 1.0 and runs["penalties"]["vs_none"] > 0
    stopped = runs["json"]["finish_reasons"].get("stop", 0)
    assert runs["json"]["validity"].get("valid", 0) >= stopped
    assert set(runs["none"]["finish_reasons"]) == {"length"}


def test_the_timed_runner_samples_constrained_steps(tiny_qwen3_dir: Path) -> None:
    """bench's TimedRunner passes a step with token masks through to its sampling (ModelRunner.sample_masked)."""
    timed = build_timed_engine(engine_config(str(tiny_qwen3_dir), max_model_len=128, kv_cache_blocks=16),
                               KernelConfig())
    constraint = StructuredOutput(regex=r"[a-c]{4}")
    timed.engine.add_request("r", [5, 6, 7], SamplingParams(seed=1, max_tokens=8, structured_output=constraint))
    tokens: list[int] = []
    while timed.engine.has_unfinished_requests():
        tokens += [t for out in timed.engine.step() for t in out.new_token_ids]
    text = load_tokenizer(str(tiny_qwen3_dir)).decode(tokens, skip_special_tokens=True)
    assert re.fullmatch(r"[a-c]{4}", text) and timed.runner.times.num_calls == len(timed.runner.times.steps) > 0
