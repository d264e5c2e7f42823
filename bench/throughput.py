"""Offline throughput and batch-1 latency of our engine, each against the device's ideal, in one command.

Workload (`--workload nano-vllm`, the default): nano-vllm's, 256 requests with prompt ids uniform in [0, 10000),
prompt lengths and max_tokens uniform in [100, 1024], temperature 0.6, ignore_eos, seed 0. `--workload serve` is
bench/serve.py's shape run offline: the reference for the server's share of the engine. A warm-up run of the same
shape (prompts drawn with another seed, so the prefix cache cannot carry them into the timed run) precedes one timed
run; throughput = generated tokens / wall time. Batch 1, after it: one request at a time, a `--prompt-len`-token
prompt, the median time per output token. The ideal (bench/roofline.py) uses the copy bandwidth and matmul rate
measured first, in the same process, and counts each weight at its stored width.

The model: a checkpoint directory (`--model`), or random weights of `--shape` (bench/bench_model.py; `--quantization`
for its projections in a quantized format), built once under /tmp/bench-models; with `--load-format dummy` only its
config.json and tokenizer are written and the engine draws the weights on the device (float weights only).

    python -m bench.throughput --out result.json
    python -m bench.throughput --shape qwen3-8b --quantization fp8 --warmup short --out result.json
    python -m bench.throughput --model /models/Qwen3-30B-A3B --tensor-parallel-size 2 --out result.json
    python -m bench.throughput --shape qwen3-30b-a3b --load-format dummy --out result.json
"""

import argparse
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from bench.bench_model import DEFAULT_SHAPE, QUANTIZATIONS, build_config_only, build_random_checkpoint, shape_config
from bench.common import write_result
from bench.engine_runs import run_workload, startup_objects_frozen, time_batch1
from bench.roofline import DTYPE_BYTES, DeviceLimits, ModelShape, decode_cost, ideal_run, measure_limits
from bench.workload import Request, fixed_workload, nano_vllm_workload
from core import LLMEngine
from core.config import engine_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a checkpoint directory (default: random weights of --shape)")
    p.add_argument("--shape", default=DEFAULT_SHAPE, help="a named shape or a config.json, for random weights")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                   help="dummy: random weights drawn by the engine on the device, no checkpoint written or read")
    p.add_argument("--quantization", choices=list(QUANTIZATIONS), default=None,
                   help="random weights' projections in this format (default: the dtype's)")
    p.add_argument("--workload", choices=["nano-vllm", "serve"], default="nano-vllm")
    p.add_argument("--num-requests", type=int, default=256, help="nano-vllm workload size")
    p.add_argument("--serve-requests", type=int, default=512, help="serve-shaped workload size")
    p.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens: serve workload and batch 1")
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
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="fp8: e4m3, a byte in the ideal")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="ranks (GPUs); the ideal is then one rank's share of the bytes and FLOPs")
    p.add_argument("--warmup", choices=["full", "short", "none"], default="full",
                   help="full: the whole workload once; short: every request with 16 tokens")
    p.add_argument("--max-seconds", type=float, default=None, help="stop the timed run here and report it partial")
    p.add_argument("--batch1-tokens", type=int, default=128, help="0 skips the batch-1 figure")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def workload(args: argparse.Namespace, seed: int) -> list[Request]:
    if args.workload == "serve":
        return fixed_workload(args.serve_requests, args.prompt_len, args.max_tokens, seed=seed)
    return nano_vllm_workload(args.num_requests, seed=seed)


def model_dir(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    name = Path(args.shape).parent.name if args.shape.endswith(".json") else args.shape
    if args.load_format == "dummy":
        if args.quantization:
            raise ValueError("--load-format dummy draws float weights: give --quantization a written checkpoint")
        return str(build_config_only(Path("/tmp/bench-models") / f"{name}-config", shape_config(args.shape)))
    name += f"-{args.quantization}" if args.quantization else ""
    return str(build_random_checkpoint(Path("/tmp/bench-models") / name, shape_config(args.shape),
                                       quantization=args.quantization))


ENGINE_FLAGS = ("dtype", "device", "load_format", "max_model_len", "enforce_eager", "attention_backend",
                "kv_cache_blocks", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                "tensor_parallel_size", "kv_cache_dtype")


def new_engine(args: argparse.Namespace, model: str) -> LLMEngine:
    return LLMEngine(engine_config(model, **{flag: getattr(args, flag) for flag in ENGINE_FLAGS}))


def ideal_figures(shape: ModelShape, args: argparse.Namespace, requests: list[Request], limits: DeviceLimits
                  ) -> dict[str, object]:
    ideal = ideal_run(shape, requests, limits)
    batch1_context = args.prompt_len + args.batch1_tokens // 2  # the mean context of the batch-1 decode steps
    return {"seconds": round(ideal.seconds, 4), "tokens_per_s": round(ideal.tokens_per_s, 1),
            "num_steps": ideal.num_steps, "tera_bytes": round(ideal.num_bytes / 1e12, 3),
            "tera_flops": round(ideal.num_flops / 1e12, 2), "weight_bytes_per_step": shape.weight_bytes(1),
            "batch1_tpot_ms": round(decode_cost(shape, [batch1_context]).seconds(limits) * 1e3, 4)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    model = model_dir(args)
    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    limits = measure_limits(device, getattr(torch, args.dtype))
    shape = replace(ModelShape.from_dir(model, DTYPE_BYTES.get(args.dtype, 2)),
                    kv_dtype_bytes=1 if args.kv_cache_dtype == "fp8" else 0).per_rank(args.tensor_parallel_size)
    requests = workload(args, args.seed)
    result: dict[str, Any] = {
        "kind": "throughput", "workload": args.workload, "model": model, "torch": torch.__version__,
        "limits": limits.figures(), "ideal": ideal_figures(shape, args, requests, limits),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
    }
    # The engine's start-up objects frozen as a served engine's are (core/startup_gc.py): a full collection would
    # otherwise walk them inside a timed run.
    with startup_objects_frozen() as frozen:
        engine = new_engine(args, model)
        runner = engine.runner
        result["engine"] = {"num_kv_blocks": engine.block_manager.num_blocks, "block_size": engine.block_size,
                            "frozen_objects": frozen, "tensor_parallel_size": args.tensor_parallel_size,
                            # in the workers' processes under tensor parallelism (their log says which)
                            "attention_backend": getattr(getattr(runner, "backend", None), "name", "in the workers")}
        if args.warmup != "none":
            warm = workload(args, args.seed + 1)
            if args.warmup == "short":
                warm = [Request(r.prompt_token_ids, 16) for r in warm]
            print(f"warm-up: {run_workload(engine, warm, args.max_seconds).tokens_per_s:.1f} tok/s", flush=True)
        run = run_workload(engine, requests, args.max_seconds)
        result["ours"] = {**asdict(run), "tokens_per_s": round(run.tokens_per_s, 1)}
        if args.batch1_tokens:
            result["batch1"] = guarded(
                lambda: asdict(time_batch1(engine, args.prompt_len, args.batch1_tokens, 3, args.seed + 2)))
    result["summary"] = summary(result)
    print(result["summary"], flush=True)
    write_result(args.out, result, "bench.throughput", argv)


def guarded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A secondary figure that fails is reported as failed; the figures measured before it are kept."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - any failure: record it and go on
        traceback.print_exc()
        return {"failed": f"{type(exc).__name__}: {exc}"}


def summary(result: dict[str, Any]) -> dict[str, float]:
    """The headline figures, each with its share of the ideal: the one place a share is computed."""
    ours, ideal = result["ours"], result["ideal"]
    figures = {"ours_tokens_per_s": ours["tokens_per_s"], "ideal_tokens_per_s": ideal["tokens_per_s"],
               "share_of_ideal": round(ours["tokens_per_s"] / ideal["tokens_per_s"], 4)}
    if "tpot_ms" in result.get("batch1", {}):
        tpot = result["batch1"]["tpot_ms"]
        figures |= {"batch1_tpot_ms": tpot, "batch1_ideal_tpot_ms": ideal["batch1_tpot_ms"],
                    "batch1_share_of_ideal": round(ideal["batch1_tpot_ms"] / tpot, 4)}
    return figures


if __name__ == "__main__":
    main()
