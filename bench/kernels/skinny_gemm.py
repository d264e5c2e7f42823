"""The skinny GEMM (gpu/kernels/skinny_gemm.py) against cuBLAS at the decode shapes of Qwen3-0.6B and the dense ones
of Qwen3-30B-A3B, 1 to 256 rows: microseconds per call, launched as gpu/layers/linear.py launches it. Each figure is
the median replay of a CUDA graph of calls rotating over weight copies (bench/kernels/timing.py), so the weights come
from HBM; bf16. The sweep prints, and writes under `table`, each (row bucket, N, K)'s fastest config, or None where
cuBLAS was not beaten by 3%: the lines of gpu/kernels/skinny_gemm_configs.py's table for this GPU.

    python -m bench.kernels.skinny_gemm --out result.json          # cuBLAS vs the table's configs (this GPU's)
    python -m bench.kernels.skinny_gemm --sweep --out sweep.json   # every candidate config; the fastest per shape
"""

import argparse
import contextlib
import itertools
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import write_result
from bench.kernels.timing import DEVICE, DTYPE, num_copies, rotated_us_per_call
from gpu.kernels.skinny_gemm import FEW_ROWS, SkinnyConfig, config_for, preferred_config, row_bucket, skinny_gemm

SHAPES = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024), "a3b_qkv": (5120, 2048), "a3b_o_proj": (2048, 4096), "a3b_router": (128, 2048),
          "a3b_lm_head": (151936, 2048)}  # name -> (N, K); a3b_: Qwen3-30B-A3B's dense products
SWEEP_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # one per row bucket: its widest row count
COMPARE_ROWS = (1, 2, 4, 8, 16, 17, 32, 48, 64, 100, 128, 192, 256)  # bucket edges and decode graph buckets
NUM_SMS = 132  # H100 SXM; H200: the same
MIN_GAIN = 0.97  # the kernel enters a table where it takes at most this share of cuBLAS's time

GemmFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    return [torch.randn(n, k, dtype=DTYPE, device=DEVICE) * k**-0.5 for _ in range(num_copies(n * k * 2))]


def relative_error(fn: GemmFn, x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor | None = None) -> float:
    ref = x.float() @ w.float().T if ref is None else ref
    return ((fn(x, w).float() - ref).norm() / ref.norm()).item()


def cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def with_config(config: SkinnyConfig | None) -> GemmFn:
    return lambda x, w: skinny_gemm(x, w, None, config, use_pdl=True)


def few_row_candidates(bucket: int, n: int, k: int) -> list[SkinnyConfig]:
    """Up to 16 rows: fma tiles for up to 8 rows (wide K tiles and split-K: more bytes in flight for one row), dot
    tiles (pointer loads or TMA) for all; split-K only where N is narrow."""
    splits = (1, 2, 4, 8) if n <= 8192 else (1,)
    out = []
    if bucket <= 8:
        tiles = [(4, 512, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8),
                 (32, 256, 4)]
        for (bn, bk, warps), split in itertools.product(tiles, splits):
            if bk * split <= k and bn * bucket <= 128:
                out.append(SkinnyConfig(bn, bk, split, False, warps, 1))
    tiles = [(32, 128, 4), (32, 256, 4), (64, 128, 4), (64, 256, 4), (128, 128, 8), (32, 512, 4)]
    for (bn, bk, warps), split, stages, tma in itertools.product(tiles, splits, (3, 4), (False, True)):
        if bk * split <= k and (not tma or (bk <= 256 and split <= 4)):
            out.append(SkinnyConfig(bn, bk, split, True, warps, stages, use_tma=tma))
    return out


def many_row_candidates(bucket: int, n: int, k: int) -> list[SkinnyConfig]:
    """17..256 rows: tensor-core tiles over rows and columns, by pointer loads or TMA; split-K (up to 4) only while
    the tiles leave SMs idle, at most 8 waves of programs; shared memory for the pipeline's stages within 200 KB."""
    tiles = [(64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 4, 4), (128, 64, 4, 4), (128, 64, 8, 4), (128, 128, 8, 3),
             (64, 256, 4, 3), (64, 256, 4, 4)]  # (block_n, block_k, warps, stages)
    out = []
    for block_m in (16, 32, 64, 128):
        if block_m > bucket:
            continue
        for (bn, bk, warps, stages), split, tma in itertools.product(tiles, (1, 2, 4), (False, True)):
            num_tiles = math.ceil(bucket / block_m) * math.ceil(n / bn)
            if (bk * split > k or (split > 1 and num_tiles >= NUM_SMS) or num_tiles * split > 8 * NUM_SMS
                    or stages * (bn + block_m) * bk * 2 > 200 << 10):
                continue
            out.append(SkinnyConfig(bn, bk, split, True, warps, stages, block_m, tma))
    return out


def candidates(bucket: int, n: int, k: int) -> list[SkinnyConfig]:
    if bucket > FEW_ROWS:
        return many_row_candidates(bucket, n, k)
    if n > 8192:  # the lm_head: dot tiles, no split
        return [SkinnyConfig(bn, bk, 1, True, warps, stages) for (bn, bk, warps), stages in itertools.product(
            [(64, 128, 4), (128, 128, 8), (32, 512, 4), (64, 256, 4)], (2, 3, 4))]
    return few_row_candidates(bucket, n, k)


def compile_key(m: int, k: int, config: SkinnyConfig) -> tuple:
    """What Triton compiles a variant for (M and N are no specialization keys; K's divisibility is the same here)."""
    return config, 0 if config.use_dot else row_bucket(m), k % (config.block_k * config.split_k) == 0


def _compile_worker(jobs: list[tuple[str, int, SkinnyConfig]]) -> None:
    """Runs this worker's share of the sweep's variants once, so that Triton's disk cache holds them; a variant that
    fails is the sweep's to report."""
    for name, m, config in jobs:
        with contextlib.suppress(Exception):
            with_config(config)(torch.randn(m, SHAPES[name][1], dtype=DTYPE, device=DEVICE),
                                torch.randn(*SHAPES[name], dtype=DTYPE, device=DEVICE))


def precompile(shapes: dict[str, tuple[int, int]], rows: tuple[int, ...], num_workers: int) -> None:
    """Each distinct variant the sweep runs compiled once, spread over `num_workers` processes."""
    jobs = {compile_key(m, k, c): (name, m, c) for name, (n, k) in shapes.items() for m in rows
            for c in candidates(row_bucket(m), n, k)}
    with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
        pool.map(_compile_worker, [list(jobs.values())[i::num_workers] for i in range(num_workers)])


def sweep_row(name: str, n: int, k: int, m: int, weights: list[torch.Tensor]) -> dict:
    """cuBLAS and every candidate at one shape and row count; a config off by more than 1% relative is dropped."""
    x = torch.randn(m, k, dtype=DTYPE, device=DEVICE)
    ref = x.float() @ weights[0].float().T
    cublas_us = rotated_us_per_call(cublas, x, weights)
    row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": round(cublas_us, 2), "configs": []}
    for config in candidates(row_bucket(m), n, k):
        fn = with_config(config)
        try:
            err = relative_error(fn, x, weights[0], ref)
            us = rotated_us_per_call(fn, x, weights) if err < 1e-2 else float("inf")
        except Exception as error:  # noqa: BLE001 - a config that fails is reported, not fatal
            err, us = float("nan"), float("inf")
            print(f"{name} M={m} {config}: {type(error).__name__}: {str(error)[:300]}", flush=True)
        row["configs"].append({**config.__dict__, "us": round(us, 2), "rel_err": err})
    row["best"] = best = min(row["configs"], key=lambda c: c["us"])
    row["is_kernel_faster"] = best["us"] <= MIN_GAIN * cublas_us
    print(f"{name:8s} M={m:3d} cublas {cublas_us:7.2f} us, best {best['us']:7.2f} us "
          f"{config_literal(best_config(row))}", flush=True)
    return row


def sweep(shapes: dict[str, tuple[int, int]], rows: tuple[int, ...], budget_s: float, out: Path | None) -> list[dict]:
    """Every candidate per shape and M; the rows so far are written to `out` after each (a killed run keeps them)."""
    start, done = time.perf_counter(), []
    for name, (n, k) in shapes.items():
        weights = weight_copies(n, k)  # one shape's copies at a time
        for m in (m for m in rows if candidates(row_bucket(m), n, k)):
            if time.perf_counter() - start > budget_s:
                print(f"budget spent: stopped before {name} M={m}", flush=True)
                return done
            done.append(sweep_row(name, n, k, m, weights))
            if out is not None:
                out.write_text(json.dumps(done))
        torch.cuda.empty_cache()
    return done


def best_config(row: dict) -> SkinnyConfig:
    return SkinnyConfig(**{f: row["best"][f] for f in SkinnyConfig.__dataclass_fields__})


def config_literal(config: SkinnyConfig | None) -> str:
    """The config as the table's helpers write it (gpu/kernels/skinny_gemm_configs.py)."""
    if config is None:
        return "None"
    if not config.use_dot:
        return f"_fma({config.block_n}, {config.block_k}, {config.split_k}, num_warps={config.num_warps})"
    return (f"_dot({config.block_n}, {config.block_k}, {config.split_k}, num_warps={config.num_warps}, "
            f"num_stages={config.num_stages}, block_m={config.block_m}{', use_tma=True' if config.use_tma else ''})")


def table_lines(rows: list[dict]) -> list[str]:
    """`(bucket, N, K): config,` per swept row: the fastest config, or None where cuBLAS was not beaten by 3%."""
    return [f"({row_bucket(row['m'])}, {row['n']}, {row['k']}): "
            f"{config_literal(best_config(row) if row['is_kernel_faster'] else None)}," for row in rows]


def compare(shapes: dict[str, tuple[int, int]], rows: tuple[int, ...]) -> list[dict]:
    """cuBLAS against the kernel with this GPU's table config at each shape and M."""
    out = []
    for name, (n, k) in shapes.items():
        weights = weight_copies(n, k)  # one shape's copies at a time
        for m in rows:
            x = torch.randn(m, k, dtype=DTYPE, device=DEVICE)
            row = {"shape": name, "n": n, "k": k, "m": m, "config": config_for(m, n, k, DEVICE).__dict__,
                   "is_routed": preferred_config(m, n, k, DEVICE) is not None,
                   "rel_err": relative_error(with_config(None), x, weights[0]),
                   "cublas_us": round(rotated_us_per_call(cublas, x, weights), 2),
                   "skinny_us": round(rotated_us_per_call(with_config(None), x, weights), 2)}
            print(f"{name:8s} M={m:3d}  cuBLAS {row['cublas_us']:7.2f} us  skinny {row['skinny_us']:7.2f} us  err "
                  f"{row['rel_err']:.1e}  {'routed' if row['is_routed'] else 'cuBLAS kept'}", flush=True)
            out.append(row)
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.kernels.skinny_gemm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every candidate config instead of the table")
    parser.add_argument("--rows", type=int, nargs="+", default=None,
                        help=f"row counts (default: {SWEEP_ROWS} with --sweep, else {COMPARE_ROWS})")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--workers", type=int, default=15, help="processes that compile the sweep's kernels")
    parser.add_argument("--budget-s", type=float, default=200.0, help="the sweep stops starting shapes after this")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    shapes = {name: SHAPES[name] for name in args.shapes}
    rows = tuple(args.rows or (SWEEP_ROWS if args.sweep else COMPARE_ROWS))
    result: dict[str, object] = {"kind": "skinny-gemm", "torch": torch.__version__}
    if args.sweep:
        precompile(shapes, rows, args.workers)
        swept = sweep(shapes, rows, args.budget_s, Path(args.out + ".partial") if args.out else None)
        result |= {"kind": "skinny-gemm-sweep", "rows": swept, "table": table_lines(swept)}
        print("\n".join(table_lines(swept)), flush=True)
    else:
        result["rows"] = compare(shapes, rows)
    write_result(args.out, result, "bench.kernels.skinny_gemm", argv)


if __name__ == "__main__":
    main()
