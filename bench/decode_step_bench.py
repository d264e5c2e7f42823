"""Times one decode step of the Qwen3-0.6B-shaped bench model (random bf16 weights) on the GPU, per kernel choice.

A step is what the engine pays: building device inputs from the batch description, the forward
pass (a CUDA-graph replay or eager), logits, sampling, and the one host sync. Reported per batch
size with a 1k-token context per sequence, graphs on and off, as the median of many steps, two
ways: `step_ms` launches a step and waits for its tokens before the next (the host's preparation
and the device's work add up); `pipelined_step_ms` runs steps as the engine does with async
scheduling: step k+1 is launched, reading step k's tokens on the device, before step k's tokens are
waited for, so the host's preparation overlaps the device's work (the interval between steps).

`--variants` compares kernel choices, one runner built per variant: each is `default` or fields of
gpu.config.KernelConfig joined by `+`, e.g. `fused_elementwise=0` (the torch layer code),
`skinny_gemm=0` (cuBLAS for every GEMM), `pdl_launches=1`, `order_decode_rows=0`.
`--profile` adds torch.profiler's kernels per step, device busy time and top kernels. `--prefill-rows R:L` adds, to
every batch, R fresh prompts of L tokens each after its decode rows (a step carrying prefill, as when requests arrive
behind full decode batches: e.g. 8:1024 with 191 decode rows is the serving shape's typical prefill step).

    python -m bench.decode_step_bench --variants default fused_elementwise=0 --profile --out result.json
"""

import argparse
import gc
import random
import statistics
import sys
import time
from dataclasses import replace

import torch

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.common import kernel_variant, write_result
from bench.profiling import profile_summary
from core.config import engine_config
from core.engine import runner_config
from gpu.batch import Batch, RowSampling
from gpu.model_runner import ModelRunner

BLOCK = 16


def decode_batch(batch_size: int, context: int, prefill_rows: int = 0, prefill_len: int = 0,
                 scattered: bool = False) -> Batch:
    """batch_size decode rows at `context` tokens, then prefill_rows fresh prompts of prefill_len tokens; each row on
    consecutive cache blocks, or with `scattered` on blocks in a random order (as a server's cache is after churn)."""
    blocks_per_seq = -(-max(context, prefill_len) // BLOCK)
    num_rows = batch_size + prefill_rows
    block_ids = list(range(num_rows * blocks_per_seq))
    if scattered:
        random.Random(0).shuffle(block_ids)
    tables = [block_ids[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(num_rows)]
    query_lens = [1] * batch_size + [prefill_len] * prefill_rows
    context_lens = [context] * batch_size + [prefill_len] * prefill_rows
    positions = [p for q, c in zip(query_lens, context_lens, strict=True) for p in range(c - q, c)]
    row_of_token = [r for r, q in enumerate(query_lens) for _ in range(q)]
    return Batch(
        token_ids=[17] * len(positions), positions=positions,
        slot_mapping=[tables[r][p // BLOCK] * BLOCK + p % BLOCK for r, p in zip(row_of_token, positions, strict=True)],
        query_lens=query_lens, context_lens=context_lens, block_tables=tables,
        sampling=[RowSampling(temperature=0.0)] * num_rows,
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


def time_pipelined_steps(runner: ModelRunner, batch: Batch, steps: int) -> tuple[float, float, float]:
    """Median interval between consecutive steps' tokens reaching the host, with one step always queued ahead;
    and the medians of the host's time in `launch` (queuing a step) and waiting in `result` per step. A host that
    never waits is the bottleneck: the interval is then its own time per step, not the device's."""
    fed_back = replace(batch, token_ids=[0] * batch.num_rows, fed_back_token_indices=list(range(batch.num_rows)),
                       fed_back_rows=list(range(batch.num_rows)))
    in_flight = runner.launch(batch)
    arrivals, launches, waits = [], [], []
    for _ in range(steps + 5):
        start = time.perf_counter()
        queued = runner.launch(fed_back)  # reads in_flight's tokens on the device
        launched = time.perf_counter()
        in_flight.result()
        arrivals.append(time.perf_counter())
        launches.append(launched - start)
        waits.append(arrivals[-1] - launched)
        in_flight = queued
    in_flight.result()
    intervals = [b - a for a, b in zip(arrivals[5:], arrivals[6:], strict=False)]
    return (statistics.median(intervals) * 1e3, statistics.median(launches[5:]) * 1e3,
            statistics.median(waits[5:]) * 1e3)


def profile_steps(runner: ModelRunner, batch: Batch, steps: int = 5) -> dict[str, object]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.execute(batch)
    return profile_summary(prof.key_averages(), steps, top=10)


def measure(args: argparse.Namespace, variant: str, is_eager: bool) -> list[dict[str, object]]:
    batches = [int(b) for b in args.batches.split(",")]
    prefill_rows, prefill_len = (int(n) for n in args.prefill_rows.split(":"))
    max_rows, blocks_per_row = max(batches) + prefill_rows, -(-max(args.context, prefill_len) // BLOCK)
    config = replace(runner_config(engine_config(
        str(build_bench_model(args.model_dir)), dtype="bfloat16", device="cuda", block_size=BLOCK,
        kv_cache_blocks=max_rows * blocks_per_row + 16, max_num_seqs=max_rows,
        max_num_batched_tokens=max(8192, max(batches) + prefill_rows * prefill_len), max_model_len=4096,
        enforce_eager=is_eager, attention_backend=args.backend,
    )), kernels=kernel_variant(variant))
    runner = ModelRunner(config)
    rows = []
    for batch_size in batches:
        batch = decode_batch(batch_size, args.context, prefill_rows, prefill_len, args.scattered_blocks)
        ms = time_steps(runner, batch, args.steps)
        pipelined_ms, launch_ms, wait_ms = time_pipelined_steps(runner, batch, args.steps) if not prefill_rows \
            else (ms, 0.0, 0.0)
        row: dict[str, object] = {
            "variant": variant, "batch": batch_size, "context": args.context, "cuda_graphs": not is_eager,
            "backend": runner.backend.name, "prefill_rows": args.prefill_rows,
            "scattered_blocks": args.scattered_blocks,
            "step_ms": round(ms, 3), "pipelined_step_ms": round(pipelined_ms, 3),
            "pipelined_host_launch_ms": round(launch_ms, 3), "pipelined_host_wait_ms": round(wait_ms, 3),
            "tokens_per_s": round(batch_size / ms * 1e3),
            "pipelined_tokens_per_s": round(batch_size / pipelined_ms * 1e3)}
        if args.profile:
            row["profile"] = profile_steps(runner, batch)
        print({k: v for k, v in row.items() if k != "profile"}, flush=True)
        rows.append(row)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.decode_step_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=DEFAULT_DIR)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batches", default="1,256", help="batch sizes, comma-separated")
    p.add_argument("--steps", type=int, default=50, help="steps per median")
    p.add_argument("--backend", default="auto")
    p.add_argument("--variants", nargs="+", default=["default"], help="kernel choices to compare (see above)")
    p.add_argument("--modes", default="graphs,eager", help="graphs, eager or both (comma-separated)")
    p.add_argument("--prefill-rows", default="0:0", help="R:L, R fresh prompts of L tokens added to every batch")
    p.add_argument("--scattered-blocks", action="store_true", help="rows on cache blocks in a random order")
    p.add_argument("--profile", action="store_true", help="kernels per step and the top kernels, per row")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    rows = [row for variant in args.variants for mode in modes
            for row in measure(args, variant, is_eager=mode == "eager")]
    print("| variant | batch | graphs | step ms | pipelined ms | host launch / wait ms | kernels/step |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        kernels = r["profile"]["kernels_per_step"] if "profile" in r else "-"  # type: ignore[index]
        print(f"| {r['variant']} | {r['batch']} | {r['cuda_graphs']} | {r['step_ms']} | {r['pipelined_step_ms']} "
              f"| {r['pipelined_host_launch_ms']} / {r['pipelined_host_wait_ms']} | {kernels} |")
    if args.out:
        write_result(args.out, {"kind": "decode-step", "torch": torch.__version__, "rows": rows},
                     "bench.decode_step_bench", argv)


if __name__ == "__main__":
    main()
