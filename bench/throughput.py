"""Offline throughput of our engine, next to transformers and to the GPU's physical limit, in one command.

Workload (`--workload nano-vllm`, the default): nano-vllm's, 256 requests with prompt ids uniform in
[0, 10000), prompt lengths and max_tokens uniform in [100, 1024], temperature 0.6, ignore_eos, seed
0, max_model_len 4096. `--workload serve` is bench/serve.py's shape run offline (`--serve-requests`
prompts of `--prompt-len` tokens, 1024 by default, `--max-tokens` tokens each, 128 by default), the reference
for the server's share of the engine.
One warm-up run of the same shape (prompts drawn with another seed, so the prefix cache cannot
carry prompts into the timed run) precedes one timed run; throughput = generated tokens / wall time.

Also measured in the same process: the GPU's copy bandwidth and matmul rate, hence the ideal time
(bench/roofline.py) and throughput as a share of it; batch-1 time per output token after a prompt of
`--prompt-len` tokens; a torch.profiler table of a few full-batch decode steps and of batch-1 steps. The peer,
transformers (bench/hf_peer.py), runs in a subprocess first, on `--peer-requests` of the requests.

    python -m bench.throughput --out bench/results/throughput-h100.json
"""

import argparse
import json
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.bench_model import build_bench_model
from bench.common import kernel_variant, write_result
from bench.device_limits import measure_limits
from bench.engine_runs import (
    TimedEngine,
    build_timed_engine,
    profile_steps,
    run_workload,
    startup_objects_frozen,
    time_batch1,
)
from bench.roofline import DTYPE_BYTES, DeviceLimits, ModelShape, ideal_decode_step_seconds, ideal_run
from bench.step_trace import StepRecord, breakdown
from bench.triton_compiles import TritonCompiles
from bench.workload import Request, fixed_workload, nano_vllm_workload
from core import LLMEngine
from core.config import engine_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: a random Qwen3-0.6B, built once)")
    p.add_argument("--model-dir", default="/tmp/qwen3-0.6b-bench", help="where the random checkpoint is built")
    p.add_argument("--workload", choices=["nano-vllm", "serve"], default="nano-vllm")
    p.add_argument("--num-requests", type=int, default=256, help="nano-vllm workload size")
    p.add_argument("--serve-requests", type=int, default=512, help="serve-shaped workload size")
    p.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens: serve workload and batch-1 figure")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per request of the serve workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-blocks", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false",
                   help="every step waits for its own tokens (the engine's default queues the next step first)")
    p.add_argument("--decode-hold-ms", type=float, default=0.0,
                   help="the engine's decode hold (core/scheduler.py): prompts first, decoding rows held this long")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--kernels", default="default", help="kernel choices for A/B runs: `default`, or gpu.config."
                   "KernelConfig fields joined by + (order_decode_rows=0+skinny_gemm=0); the engine's runner is "
                   "built with them")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="ranks (GPUs); the ideal is then one rank's share of the bytes and FLOPs")
    p.add_argument("--warmup", choices=["full", "short", "none"], default="full",
                   help="full: the whole workload once; short: every request with 16 tokens")
    p.add_argument("--max-seconds", type=float, default=None, help="stop the timed run here and report it partial")
    p.add_argument("--peer", choices=["hf", "none"], default="hf")
    p.add_argument("--peer-requests", type=int, default=256, help="the peer runs the first N requests")
    p.add_argument("--peer-max-seconds", type=float, default=None)
    p.add_argument("--peer-timeout", type=float, default=900.0, help="kill the peer's process after this long")
    p.add_argument("--batch1-tokens", type=int, default=128, help="0 skips the batch-1 latency figure")
    p.add_argument("--profile-steps", type=int, default=10, help="0 skips the profile")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def workload(args: argparse.Namespace, seed: int) -> list[Request]:
    if args.workload == "serve":
        return fixed_workload(args.serve_requests, args.prompt_len, args.max_tokens, seed=seed)
    return nano_vllm_workload(args.num_requests, seed=seed)


def build_engine(args: argparse.Namespace, model_dir: str) -> TimedEngine:
    config = engine_config(
        model_dir, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        enforce_eager=args.enforce_eager, attention_backend=args.attention_backend,
        kv_cache_blocks=args.kv_cache_blocks, gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=args.async_scheduling, tensor_parallel_size=args.tensor_parallel_size,
        decode_hold_ms=args.decode_hold_ms,
    )
    return build_timed_engine(config, kernel_variant(args.kernels))


def run_peer(args: argparse.Namespace, model_dir: str) -> dict[str, object]:
    """transformers on the first --peer-requests requests, in its own process; failures are reported, not raised."""
    if args.workload != "nano-vllm":
        return {"skipped": "the peer runs the nano-vllm workload only"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        command = [sys.executable, "-m", "bench.hf_peer", "--model", model_dir, "--seed", str(args.seed),
                   "--num-requests", str(min(args.peer_requests, args.num_requests)), "--out", str(out)]
        if args.peer_max_seconds is not None:
            command += ["--max-seconds", str(args.peer_max_seconds)]
        try:
            done = subprocess.run(command, timeout=args.peer_timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"failed": f"no result within {args.peer_timeout:.0f} s"}
        print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", flush=True)
        if done.returncode != 0 or not out.exists():
            return {"failed": f"exit code {done.returncode}: {done.stderr[-600:]}"}
        peer = json.loads(out.read_text())
    peer["is_subset"] = peer["num_requests"] < args.num_requests
    return peer


def ideal_figures(model_dir: str, args: argparse.Namespace, requests: list[Request], limits: DeviceLimits
                  ) -> dict[str, object]:
    shape = ModelShape.from_dir(model_dir, DTYPE_BYTES.get(args.dtype, 2)).per_rank(args.tensor_parallel_size)
    ideal = ideal_run(shape, requests, limits)
    batch1_context = args.prompt_len + args.batch1_tokens // 2  # the mean context of the batch-1 decode steps
    return {
        "seconds": round(ideal.seconds, 4), "tokens_per_s": round(ideal.tokens_per_s, 1),
        "num_steps": ideal.num_steps, "tera_bytes": round(ideal.num_bytes / 1e12, 3),
        "tera_flops": round(ideal.num_flops / 1e12, 2), "kv_share_of_bytes": round(ideal.kv_share, 4),
        "weight_bytes_per_step": shape.weight_bytes_per_step, "kv_bytes_per_token": shape.kv_bytes_per_token,
        "batch1_tpot_ms": round(ideal_decode_step_seconds(shape, batch1_context, limits) * 1e3, 4),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    model_dir = args.model or str(build_bench_model(args.model_dir))
    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    limits = measure_limits(device, getattr(torch, args.dtype))
    print(f"limits: copy {limits.copy_bytes_per_s / 1e12:.3f} TB/s, matmul {limits.matmul_flops_per_s / 1e12:.1f} "
          f"TFLOP/s", flush=True)
    requests = workload(args, args.seed)
    result: dict[str, Any] = {
        "kind": "throughput", "workload": args.workload, "model": args.model or "random Qwen3-0.6B (bf16)",
        "torch": torch.__version__,
        "limits": {"copy_tb_per_s": round(limits.copy_bytes_per_s / 1e12, 4),
                   "matmul_tflop_per_s": round(limits.matmul_flops_per_s / 1e12, 1)},
        "ideal": ideal_figures(model_dir, args, requests, limits),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "model_dir")},
    }
    if args.peer == "hf":
        result["peer"] = run_peer(args, model_dir)
        print("peer:", json.dumps(result["peer"]), flush=True)
    # The engine's start-up objects frozen as a served engine's are (core/startup_gc.py): unfrozen, a full
    # collection (~250 ms on the H100 machine) landed inside a batch-1 sample.
    with startup_objects_frozen() as frozen:
        timed = build_engine(args, model_dir)
        engine = timed.engine
        result["engine"] = {"num_kv_blocks": engine.block_manager.num_blocks, "block_size": engine.block_size,
                            "frozen_objects": frozen,
                            "tensor_parallel_size": args.tensor_parallel_size,
                            # in the workers' processes under tensor parallelism (their log says which)
                            "attention_backend": getattr(getattr(timed.runner.runner, "backend", None), "name",
                                                         "in the workers"),
                            "kernels": asdict(timed.runner.runner.config.kernels),
                            # per phase, each candidate's step milliseconds as `auto` measured them at start-up
                            "attention_times_ms": getattr(timed.runner.runner, "attention_times", None)}
        print(f"attention backend: {result['engine']['attention_backend']} "
              f"(measured: {result['engine']['attention_times_ms']})", flush=True)
        if args.batch1_tokens:  # before any load, to compare with the same figure after the timed run
            result["batch1_fresh"] = guarded(
                lambda: asdict(time_batch1(timed, args.prompt_len, args.batch1_tokens, 3, args.seed + 5)))
            print("batch-1 on the fresh engine:", result["batch1_fresh"], flush=True)
        if args.warmup != "none":
            warm = workload(args, args.seed + 1)
            if args.warmup == "short":
                warm = [Request(r.prompt_token_ids, 16) for r in warm]
            print(f"warm-up: {run_workload(timed, warm, args.max_seconds).tokens_per_s:.1f} tok/s", flush=True)
        trace: list[StepRecord] = []
        with TritonCompiles() as compiles:
            run = run_workload(timed, requests, args.max_seconds, trace)
        result["ours"] = {**asdict(run), "tokens_per_s": round(run.tokens_per_s, 1),
                          "triton_compiles_during_run": compiles.summary()}
        print("triton compiles during the timed run:", compiles.summary(), flush=True)
        shape = ModelShape.from_dir(model_dir, DTYPE_BYTES.get(args.dtype, 2)).per_rank(args.tensor_parallel_size)
        result["ours"]["step_breakdown"] = breakdown(trace, shape, limits)
        for row in result["ours"]["step_breakdown"]:
            print(row, flush=True)
        print(f"ours: {run.tokens_per_s:.1f} tok/s ({run.num_output_tokens} tokens in {run.seconds:.2f} s, "
              f"{run.num_steps} steps, {run.runner_seconds:.2f} s in the runner, {run.wait_seconds:.2f} s waiting)",
              flush=True)
        if args.batch1_tokens:
            result["batch1"] = guarded(
                lambda: asdict(time_batch1(timed, args.prompt_len, args.batch1_tokens, 3, args.seed + 2)))
            print("batch-1:", result["batch1"], flush=True)
        if args.profile_steps:
            result["profile"] = guarded(lambda: profile(engine, args))
    summarize(result)
    if args.out:
        write_result(args.out, result, "bench.throughput", argv)


def profile(engine: LLMEngine, args: argparse.Namespace) -> dict[str, object]:
    """A few steps with prefill at the start of the workload (past its first, partly filled ones; with the serving
    shape and a decode hold, prompts-only steps of 8 x 1024 tokens), a few decode steps of the full workload (past its
    prefills, short of its shortest request's end), and a few of one request alone."""
    full = workload(args, args.seed + 3)
    return {
        "first_steps_with_prefill": profile_steps(engine, workload(args, args.seed + 5), skip_steps=3,
                                                  num_steps=args.profile_steps),
        "full_batch_decode": profile_steps(engine, full, skip_steps=min(40, min(r.max_tokens for r in full) // 2),
                                           num_steps=args.profile_steps),
        "batch1_decode": profile_steps(engine, fixed_workload(1, args.prompt_len, 128, seed=args.seed + 4),
                                       skip_steps=5, num_steps=args.profile_steps),
    }


def guarded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A secondary figure that fails is reported as failed; the figures measured before it are kept."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - any failure: record it and go on
        traceback.print_exc()
        return {"failed": f"{type(exc).__name__}: {exc}"}


def summarize(result: dict[str, Any]) -> None:
    """Adds the ratios the issue asks for and prints them last, where the device reply shows them."""
    ours, ideal = result["ours"], result["ideal"]
    summary = {"ours_tokens_per_s": ours["tokens_per_s"], "ideal_tokens_per_s": ideal["tokens_per_s"],
               "share_of_ideal": round(ours["tokens_per_s"] / ideal["tokens_per_s"], 4)}
    peer = result.get("peer")
    if isinstance(peer, dict) and "tokens_per_s" in peer:
        summary["peer_tokens_per_s"] = peer["tokens_per_s"]
        summary["ours_over_peer"] = round(ours["tokens_per_s"] / peer["tokens_per_s"], 2)
    if "tpot_ms" in result.get("batch1", {}):
        summary["batch1_tpot_ms"] = result["batch1"]["tpot_ms"]
        summary["batch1_ideal_tpot_ms"] = ideal["batch1_tpot_ms"]
    result["summary"] = summary
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
