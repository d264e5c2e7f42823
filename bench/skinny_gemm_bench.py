"""The skinny GEMM (gpu/kernels/skinny_gemm.py) against cuBLAS (F.linear) at the decode shapes of Qwen3-0.6B.

Per shape and rows M in {1, 2, 4, 8, 16}: microseconds per call and the weight bytes read per second as a share
of the device-to-device copy bandwidth measured in the same run. Each figure is the median replay of a CUDA graph
of many calls that rotate over copies of the weight totalling 256 MB (five times the 50 MB L2), so the weights
come from HBM as they do in a decode step; x stays in L2, as activations do. bf16.

    python -m bench.skinny_gemm_bench --out result.json          # cuBLAS vs the table's configs
    python -m bench.skinny_gemm_bench --sweep --out sweep.json   # every candidate config; the fastest per shape

Whole decode steps with the kernel off and on: `python -m bench.decode_step_bench --variants default skinny_gemm=0`.
"""

import argparse
import itertools
import json
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import write_result
from bench.device_limits import measure_copy_bytes_per_s
from gpu.kernels.skinny_gemm import SkinnyConfig, config_for, preferred_config, row_bucket, skinny_gemm

SHAPES = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}  # name -> (N, K)
PER_LAYER = ("qkv", "o_proj", "gate_up", "down")
SWEEP_SHAPES = {name: SHAPES[name] for name in PER_LAYER}  # lm_head: cuBLAS already reads it at ~94% of copy
NUM_LAYERS = 28
ROWS = (1, 2, 4, 8, 16)
ROTATION_BYTES = 256 << 20
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")

GemmFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    count = max(2, math.ceil(ROTATION_BYTES / (n * k * 2)))
    return [torch.randn(n, k, dtype=DTYPE, device=DEVICE) * k**-0.5 for _ in range(count)]


def graph_us_per_call(fn: GemmFn, x: torch.Tensor, weights: list[torch.Tensor], replays: int = 7) -> float:
    calls = weights * max(1, math.ceil(32 / len(weights)))
    for w in weights:
        fn(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in calls:
            fn(x, w)
    graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(samples)


def relative_error(fn: GemmFn, x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor | None = None) -> float:
    ref = x.float() @ w.float().T if ref is None else ref
    return ((fn(x, w).float() - ref).norm() / ref.norm()).item()


def cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def with_config(config: SkinnyConfig | None, use_pdl: bool = False) -> GemmFn:
    return lambda x, w: skinny_gemm(x, w, None, config, use_pdl)


def candidates(bucket: int, n: int, k: int) -> list[SkinnyConfig]:
    """The sweep's space: fma tiles for up to 8 rows, dot tiles for all; split-K only where N is narrow."""
    splits = (1, 2, 4) if n <= 8192 else (1,)
    out = []
    if bucket <= 8:
        tiles = [(4, 512, 4), (4, 1024, 4), (8, 256, 4), (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 4),
                 (16, 512, 8), (32, 256, 4), (32, 512, 8)]
        for (bn, bk, warps), split, stages in itertools.product(tiles, splits, (1, 3)):
            if bk * split <= k and bn * bucket <= 128:
                out.append(SkinnyConfig(bn, bk, split, False, warps, stages))
    tiles = [(16, 128, 4), (16, 256, 4), (32, 128, 4), (32, 256, 4), (64, 128, 4), (64, 256, 4), (128, 128, 8),
             (32, 512, 4)]
    for (bn, bk, warps), split, stages in itertools.product(tiles, splits, (2, 3, 4)):
        if bk * split <= k:
            out.append(SkinnyConfig(bn, bk, split, True, warps, stages))
    return out


def sweep_jobs() -> list[tuple[str, int, SkinnyConfig]]:
    return [(name, m, c) for name, (n, k) in SWEEP_SHAPES.items() for m in ROWS
            for c in candidates(row_bucket(m), n, k)]


def _compile_worker(args: tuple[int, int, bool]) -> int:
    """Runs this worker's share of the sweep's configs once, so that Triton's disk cache holds them."""
    index, count, use_pdl = args
    jobs = [j for j in sweep_jobs() if hash((j[1], j[2])) % count == index]
    inputs = {name: (torch.randn(16, k, dtype=DTYPE, device=DEVICE), torch.randn(n, k, dtype=DTYPE, device=DEVICE))
              for name, (n, k) in SHAPES.items()}
    for name, m, config in jobs:
        x, w = inputs[name]
        try:
            skinny_gemm(x[:m], w, None, config, use_pdl)
        except Exception as error:  # noqa: BLE001 - the sweep reports it; a worker must go on
            print(f"{config} M={m}: {type(error).__name__}: {str(error)[:300]}", flush=True)
    torch.cuda.synchronize()
    return len(jobs)


def precompile(num_workers: int, use_pdl: bool) -> None:
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
        done = sum(pool.map(_compile_worker, [(i, num_workers, use_pdl) for i in range(num_workers)]))
    print(f"compiled {done} sweep calls in {time.perf_counter() - start:.0f} s", flush=True)


def sweep(budget_s: float, out: Path | None, use_pdl: bool) -> list[dict]:
    """Every candidate per shape and M; the rows so far are written to `out` after each (a killed run keeps them)."""
    start, rows = time.perf_counter(), []
    for name, (n, k) in SWEEP_SHAPES.items():
        weights = weight_copies(n, k)
        for m in ROWS:
            if time.perf_counter() - start > budget_s:
                print(f"budget spent: stopped before {name} M={m}", flush=True)
                return rows
            x = torch.randn(m, k, dtype=DTYPE, device=DEVICE)
            ref = x.float() @ weights[0].float().T
            row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": graph_us_per_call(cublas, x, weights),
                   "configs": []}
            for config in candidates(row_bucket(m), n, k):
                fn = with_config(config, use_pdl)
                try:
                    err = relative_error(fn, x, weights[0], ref)
                    us = graph_us_per_call(fn, x, weights) if err < 1e-2 else float("inf")
                except Exception as error:  # noqa: BLE001 - a config that fails is reported, not fatal
                    err, us = float("nan"), float("inf")
                    print(f"{name} M={m} {config}: {type(error).__name__}: {str(error)[:300]}", flush=True)
                row["configs"].append({**config.__dict__, "us": round(us, 2), "rel_err": err})
            best = min(row["configs"], key=lambda c: c["us"])
            print(f"{name:8s} M={m:2d} cublas {row['cublas_us']:8.2f} us  best {best['us']:8.2f} us  {best}",
                  flush=True)
            rows.append(row)
            if out is not None:
                out.write_text(json.dumps(rows))
        del weights
        torch.cuda.empty_cache()
    return rows


def compare(copy_bytes_per_s: float) -> list[dict]:
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = weight_copies(n, k)
        for m in ROWS:
            x = torch.randn(m, k, dtype=DTYPE, device=DEVICE)
            row = {"shape": name, "n": n, "k": k, "m": m, "config": config_for(m, n, k).__dict__,
                   "is_routed": preferred_config(m, n, k) is not None,
                   "rel_err": relative_error(with_config(None), x, weights[0])}
            for label, fn in (("cublas", cublas), ("skinny", with_config(None)),
                              ("skinny_pdl", with_config(None, use_pdl=True))):
                us = graph_us_per_call(fn, x, weights)
                row[f"{label}_us"] = round(us, 2)
                row[f"{label}_bw_share"] = round(n * k * 2 / (us * 1e-6) / copy_bytes_per_s, 3)
            print(f"{name:8s} M={m:2d}  cuBLAS {row['cublas_us']:7.2f} us ({row['cublas_bw_share']:.0%})  "
                  f"skinny {row['skinny_us']:7.2f} us ({row['skinny_bw_share']:.0%})  "
                  f"skinny+PDL {row['skinny_pdl_us']:7.2f} us ({row['skinny_pdl_bw_share']:.0%})  "
                  f"err {row['rel_err']:.1e}  {'routed' if row['is_routed'] else 'cuBLAS kept'}", flush=True)
            rows.append(row)
        del weights
        torch.cuda.empty_cache()
    return rows


def per_step_totals(rows: list[dict]) -> dict[int, dict[str, float]]:
    """GEMM microseconds of one decode step (28 layers + lm_head), summed from the per-shape medians."""
    totals = {}
    for m in ROWS:
        by_shape = {r["shape"]: r for r in rows if r["m"] == m}
        totals[m] = {label: round(sum(by_shape[s][f"{label}_us"] * (NUM_LAYERS if s in PER_LAYER else 1)
                                      for s in SHAPES), 1) for label in ("cublas", "skinny", "skinny_pdl")}
        print(f"decode step GEMMs at M={m:2d} (us): {totals[m]}")
    return totals


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.skinny_gemm_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every candidate config instead of the table")
    parser.add_argument("--workers", type=int, default=14, help="processes that compile the sweep's kernels")
    parser.add_argument("--budget-s", type=float, default=150.0, help="the sweep stops starting shapes after this")
    parser.add_argument("--pdl", action="store_true", help="sweep with programmatic dependent launch")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    copy_bytes_per_s = measure_copy_bytes_per_s(DEVICE, 2 << 30)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bytes_per_s / 1e12:.2f} TB/s", flush=True)
    result: dict[str, object] = {"kind": "skinny-gemm", "torch": torch.__version__,
                                 "copy_tb_per_s": round(copy_bytes_per_s / 1e12, 3)}
    if args.sweep:
        precompile(args.workers, args.pdl)
        result["rows"] = sweep(args.budget_s, Path(args.out + ".partial") if args.out else None, args.pdl)
    else:
        result["rows"] = compare(copy_bytes_per_s)
        result["decode_step_gemm_us"] = per_step_totals(result["rows"])  # type: ignore[arg-type]
    if args.out:
        write_result(args.out, result, "bench.skinny_gemm_bench", argv)


if __name__ == "__main__":
    main()
