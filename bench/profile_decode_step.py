"""Where a decode step's time goes: the fused elementwise kernels against the torch layer code, in one run.

Builds one runner for the Qwen3-0.6B-shaped random checkpoint (the one bench/decode_step_bench.py
uses), then for each path (torch layers, fused Triton kernels) captures CUDA graphs for batch 1 and
256 and reports: the whole step (what the engine pays), the graph replay alone, the logits and
argmax alone (medians), and, from torch.profiler, the kernels per step and the top kernels by GPU
time at batch 1.

    python -m bench.profile_decode_step --out-dir DIR
"""

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.decode_step_bench import BLOCK, decode_batch, time_steps
from bench.random_checkpoint import build_random_qwen3_0p6b
from gpu.config import RunnerConfig
from gpu.model_runner import ModelRunner

CONTEXT = 1024


def median_ms(fn: Callable[[], object], repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def kernel_table(runner: ModelRunner, batch_size: int, steps: int = 5) -> tuple[int, str]:
    batch = decode_batch(batch_size, CONTEXT)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.execute(batch)
    averages = prof.key_averages()
    events = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]
    num_kernels = sum(e.count for e in events) // steps
    by_gpu = averages.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=70)
    by_host = averages.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70)
    return num_kernels, f"-- by GPU time ({steps} steps) --\n{by_gpu}\n-- by host time --\n{by_host}"


def measure(runner: ModelRunner, label: str, out_dir: Path) -> list[dict]:
    rows = []
    for batch_size in (1, 256):
        batch = decode_batch(batch_size, CONTEXT)
        graph = runner.decode.graphs[batch_size]
        hidden = runner.decode.outputs[batch_size]
        row = {
            "path": label, "batch": batch_size,
            "step_ms": round(time_steps(runner, batch, steps=50), 3),
            "replay_ms": round(median_ms(graph.replay), 3),
            "logits_argmax_ms": round(median_ms(lambda h=hidden: runner.model.compute_logits(h).argmax(-1)), 3),
        }
        row["kernels_per_step"], table = kernel_table(runner, batch_size)
        with (out_dir / "profile.txt").open("a") as f:
            f.write(f"== {label}, batch {batch_size}, {row['kernels_per_step']} kernels per step ==\n{table}\n")
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/qwen3-0.6b-random")
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    config = RunnerConfig(
        model_path=str(build_random_qwen3_0p6b(args.model_dir)), dtype="bfloat16", device="cuda",
        block_size=BLOCK, num_kv_blocks=256 * -(-CONTEXT // BLOCK) + 16, max_num_seqs=256,
        max_num_batched_tokens=8192, max_model_len=4096, enforce_eager=True, attention_backend="triton",
    )
    runner = ModelRunner(config)  # eager: graphs are captured below, once per path
    assert runner.decode is not None
    runner.decode.buckets = [1, 256]
    rows = []
    for label, is_fused in (("torch-layers", False), ("fused", True)):
        runner.model.set_fused_kernels(is_fused)
        # A fresh pool: the old graphs' pool goes with them, and capturing into it again fails.
        runner.decode.graphs.clear()
        runner.decode.outputs.clear()
        runner.decode.pool = None
        runner.decode.capture()
        rows += measure(runner, label, out_dir)
    print("| path | batch | step ms | graph replay ms | logits+argmax ms | kernels/step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['path']} | {r['batch']} | {r['step_ms']} | {r['replay_ms']} | {r['logits_argmax_ms']} "
              f"| {r['kernels_per_step']} |")


if __name__ == "__main__":
    main()
