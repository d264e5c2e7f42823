"""Times one decode step of a Qwen3-0.6B-shaped model (random bf16 weights) on the GPU.

A step is what the engine pays: building device inputs from the batch description, the forward
pass (a CUDA-graph replay or eager), logits, sampling, and the one host sync. Reported at batch 1
and 256 with a 1k-token context per sequence, graphs on and off, as the median of many steps, two
ways: `step_ms` launches a step and waits for its tokens before the next (the host's preparation
and the device's work add up); `pipelined_step_ms` runs steps as the engine does with async
scheduling: step k+1 is launched, reading step k's tokens on the device, before step k's tokens are
waited for, so the host's preparation overlaps the device's work (the interval between steps).

    python -m bench.decode_step_bench --out result.json
"""

import argparse
import gc
import json
import statistics
import subprocess
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import torch

from bench.random_checkpoint import build_random_qwen3_0p6b
from gpu.batch import Batch, RowSampling
from gpu.config import RunnerConfig
from gpu.model_runner import ModelRunner

BLOCK = 16


def decode_batch(batch_size: int, context: int) -> Batch:
    blocks_per_seq = -(-context // BLOCK)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch_size)]
    position = context - 1
    return Batch(
        token_ids=[17] * batch_size, positions=[position] * batch_size,
        slot_mapping=[t[position // BLOCK] * BLOCK + position % BLOCK for t in tables],
        query_lens=[1] * batch_size, context_lens=[context] * batch_size, block_tables=tables,
        sampling=[RowSampling(temperature=0.0)] * batch_size,
    )


def time_steps(runner: ModelRunner, batch: Batch, steps: int) -> float:
    for _ in range(5):
        runner.execute(batch)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        runner.execute(batch)  # ends in the step's one host sync
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def time_pipelined_steps(runner: ModelRunner, batch: Batch, steps: int) -> float:
    """Median interval between consecutive steps' tokens reaching the host, with one step always queued ahead."""
    fed_back = replace(batch, token_ids=[0] * batch.num_rows, fed_back_token_indices=list(range(batch.num_rows)),
                       fed_back_rows=list(range(batch.num_rows)))
    in_flight = runner.launch(batch)
    arrivals = []
    for _ in range(steps + 5):
        queued = runner.launch(fed_back)  # reads in_flight's tokens on the device
        in_flight.result()
        arrivals.append(time.perf_counter())
        in_flight = queued
    in_flight.result()
    intervals = [b - a for a, b in zip(arrivals[5:], arrivals[6:], strict=False)]
    return statistics.median(intervals) * 1e3


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default="/tmp/qwen3-0.6b-random")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model_dir = build_random_qwen3_0p6b(args.model_dir)
    rows = []
    for enforce_eager in (False, True):
        config = RunnerConfig(
            model_path=str(model_dir), dtype="bfloat16", device="cuda", block_size=BLOCK,
            num_kv_blocks=256 * -(-args.context // BLOCK) + 16, max_num_seqs=256, max_num_batched_tokens=8192,
            max_model_len=4096, enforce_eager=enforce_eager, attention_backend=args.backend,
        )
        runner = ModelRunner(config)
        for batch_size in (1, 256):
            batch = decode_batch(batch_size, args.context)
            ms = time_steps(runner, batch, steps=50)
            pipelined_ms = time_pipelined_steps(runner, batch, steps=50)
            rows.append({"batch": batch_size, "context": args.context, "cuda_graphs": not enforce_eager,
                         "backend": runner.backend.name, "step_ms": round(ms, 3),
                         "pipelined_step_ms": round(pipelined_ms, 3),
                         "tokens_per_s": round(batch_size / ms * 1e3),
                         "pipelined_tokens_per_s": round(batch_size / pipelined_ms * 1e3)})
            print(rows[-1], flush=True)
        del runner
        gc.collect()
        torch.cuda.empty_cache()
    result = {
        "what": "one decode step of a Qwen3-0.6B-shaped model, random bf16 weights, median of 50 steps; "
                "step_ms: launch then wait; pipelined_step_ms: the next step queued before waiting (async scheduling)",
        "device": torch.cuda.get_device_name(), "date": date.today().isoformat(),
        "commit": git_commit(),
        "command": "python -m bench.decode_step_bench", "torch": torch.__version__, "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
