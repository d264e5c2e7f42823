"""The skinny GEMM (gpu/kernels/skinny_gemm.py) against cuBLAS at Qwen3-0.6B's and -30B-A3B's decode shapes, 1-256 rows;
`--weights fp8|int4`: the quantized GEMMs (fp8_gemm.py, 128x128 blocks; int_gemm.py) against their tensor-core rule.
Microseconds a call: the median replay of a CUDA graph of calls rotating over weight copies (bench/kernels/timing.py).
`--sweep` prints and writes under `table` each shape and row bucket's fastest config: lines of skinny_gemm_configs.py's
table (None: cuBLAS not beaten by 3%) or quant_gemm_configs.py's; else the baseline against this GPU's table or rule."""

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
from gpu.kernels.fp8_gemm import fp8_gemm
from gpu.kernels.int_gemm import int_gemm
from gpu.kernels.quant_gemm_configs import GemvTiles, QuantTiles, Tiles, WideGemvTiles, tensor_core_tiles
from gpu.kernels.skinny_gemm import FEW_ROWS, SkinnyConfig, row_bucket, skinny_gemm
from gpu.quant.fp8 import dequantize_blocks
from gpu.quant.int_weights import IntGroups, IntWeight, to_kernel_form

SHAPES = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024), "a3b_qkv": (5120, 2048), "a3b_o_proj": (2048, 4096), "a3b_router": (128, 2048),
          "a3b_lm_head": (151936, 2048), "q8b_qkv": (6144, 4096), "q8b_o_proj": (4096, 4096),
          "q8b_gate_up": (24576, 4096), "q8b_down": (4096, 12288),  # name -> (N, K); a3b_/q8b_: Qwen3-30B-A3B/-8B's
          "smol_qkv": (960, 576), "smol_o_proj": (576, 576), "smol_gate_up": (3072, 576), "smol_down": (576, 1536)}
QUANT_SHAPES = ["q8b_qkv", "q8b_o_proj", "q8b_gate_up", "q8b_down", "a3b_qkv", "a3b_o_proj"]
SWEEP_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # one per row bucket: its widest row count
COMPARE_ROWS = (1, 2, 4, 8, 16, 17, 32, 48, 64, 100, 128, 192, 256)  # bucket edges and decode graph buckets
NUM_SMS = 132  # H100 SXM; H200: the same
MIN_GAIN = 0.97  # the kernel enters a table where it takes at most this share of cuBLAS's time
MAX_ERROR = {"bf16": 1e-2, "int4": 1e-2, "fp8": 0.1}  # relative; FP8's tensor-core path quantizes x (4% an element)
WIDE = ([(4, 1, 1), (4, 2, 1), (4, 4, 1), (8, 1, 1), (8, 1, 2), (2, 4, 1), (4, 2, 2)],  # rows, loads of each, warps
        [(0, False), (1, False), (2, False), (2, True)])  # the wide row GEMV's tiles fetched into L2 ahead, in order

Weight = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | IntWeight  # bf16; FP8 levels and block scales; int4
GemmFn = Callable[[torch.Tensor, Weight], torch.Tensor]
Config = SkinnyConfig | Tiles


def weight_copies(n: int, k: int, weights: str) -> list[Weight]:
    return [random_weight(n, k, weights) for _ in range(num_copies(n * k * {"bf16": 4, "fp8": 2}.get(weights, 1) // 2))]


def random_weight(n: int, k: int, weights: str) -> Weight:
    if weights == "fp8":
        return torch.randn(n, k, device=DEVICE).to(torch.float8_e4m3fn), torch.rand(n // 128, k // 128, device=DEVICE)
    if weights == "int4":
        levels = torch.randint(0, 16, (n, k), dtype=torch.int32, device=DEVICE)
        groups = k // (128 if k % 128 == 0 else 32)  # K of 576 (the default model's): its GGUF's groups of 32
        return to_kernel_form(IntGroups(4, levels, torch.rand(n, groups, device=DEVICE) * k**-0.5), DTYPE)
    return torch.randn(n, k, dtype=DTYPE, device=DEVICE) * k**-0.5


def relative_error(fn: GemmFn, x: torch.Tensor, w: Weight) -> float:
    """Against x @ W.T in float32, W dequantized."""
    dense = w.int_groups().dequantize() if isinstance(w, IntWeight) else (
        dequantize_blocks(*w, (128, 128)) if isinstance(w, tuple) else w.float())
    ref = x.float() @ dense.T
    return ((fn(x, w).float() - ref).norm() / ref.norm()).item()


def with_config(config: Config | None, weights: str) -> GemmFn:
    """The product on `config` (None: the table's or the rule's)."""
    if weights == "fp8":
        return lambda x, w: fp8_gemm(x, *w, (128, 128), tiles=config)  # type: ignore[misc, arg-type]
    if weights == "int4":
        return lambda x, w: int_gemm(x, w, tiles=config)  # type: ignore[arg-type]
    return lambda x, w: skinny_gemm(x, w, None, config, use_pdl=True)  # type: ignore[arg-type]


def baseline(weights: str, m: int, n: int, k: int) -> GemmFn:
    """What a candidate is timed against: cuBLAS, or for quantized weights their tensor-core rule."""
    return F.linear if weights == "bf16" else with_config(tensor_core_tiles(m, n, k, weights, NUM_SMS), weights)


def few_row_candidates(bucket: int, n: int, k: int) -> list[SkinnyConfig]:
    """Up to 16 rows: fma tiles for up to 8 rows (wide K tiles and split-K: more bytes in flight for one row), dot
    tiles (pointer loads or TMA) for all; split-K only where N is narrow."""
    splits = (1, 2, 4, 8) if n <= 8192 else (1,)
    fma = [(4, 512, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8), (32, 256, 4)]
    dot = [(32, 128, 4), (32, 256, 4), (64, 128, 4), (64, 256, 4), (128, 128, 8), (32, 512, 4)]
    return [SkinnyConfig(bn, bk, split, False, warps, 1) for (bn, bk, warps), split in itertools.product(fma, splits)
            if bucket <= 8 and bk * split <= k and bn * bucket <= 128] + [
        SkinnyConfig(bn, bk, split, True, warps, stages, use_tma=tma)
        for (bn, bk, warps), split, stages, tma in itertools.product(dot, splits, (3, 4), (False, True))
        if bk * split <= k and (not tma or (bk <= 256 and split <= 4))]


def many_row_candidates(bucket: int, n: int, k: int) -> list[SkinnyConfig]:
    """17..256 rows: tensor-core tiles over rows and columns, by pointer loads or TMA; split-K (up to 4) only while
    the tiles leave SMs idle, at most 8 waves of programs; shared memory for the pipeline's stages within 200 KB."""
    tiles = [(64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 4, 4), (128, 64, 4, 4), (128, 64, 8, 4), (128, 128, 8, 3),
             (64, 256, 4, 3), (64, 256, 4, 4)]  # (block_n, block_k, warps, stages)
    return [SkinnyConfig(bn, bk, split, True, warps, stages, block_m, tma)
            for block_m, (bn, bk, warps, stages), split, tma in itertools.product(
                (16, 32, 64, 128), tiles, (1, 2, 4), (False, True))
            if block_m <= bucket and bk * split <= k and stages * (bn + block_m) * bk * 2 <= 200 << 10
            and (num_tiles := math.ceil(bucket / block_m) * math.ceil(n / bn)) * split <= 8 * NUM_SMS
            and (split == 1 or num_tiles < NUM_SMS)]


def candidates(weights: str, bucket: int, n: int, k: int) -> list[Config | None]:
    if weights != "bf16":  # tensor cores; quant_gemv tiles of 1..4 loads a thread; FP8 at one row also fp8_row_gemv's
        block_ks = [bk for bk in (256, 512, 1024, 2048, 4096) if bk <= k]
        is_fp8_row = (weights, bucket) == ("fp8", 1)  # both one-row GEMVs are tried there, quant_gemv's flagged
        row = [GemvTiles(1, bn, bk, w) for bn, bk, w in itertools.product((1, 2, 4, 8), block_ks, (1, 2, 4, 8))
               if is_fp8_row and 512 * w <= max(bk, 512) and 2 <= bn * bk / (512 * w) <= 8]  # 2..8 loads a thread
        gemv = [GemvTiles(bucket, bn, bk, w, is_row_gemv=not is_fp8_row)
                for bn, bk, w in itertools.product((2, 4, 8, 16), block_ks, (4, 8))  # codes a byte: 2 int4, 1 fp8
                if 1 <= bn * bk / (512 * w * (2 if weights == "int4" else 1)) <= 4 and bucket * bn * bk <= 4096 * w]
        wide = [WideGemvTiles(bn, c * w << 10, w, s, p, o) for (bn, c, w), (p, o), s in itertools.product(*WIDE, (1, 2))
                if (weights, bucket) == ("int4", 1) and s * c * w << 10 <= k and (s == 1 or n <= 8192)]  # int4's wide
        is_small = weights == "int4" and bucket > 1 and n * k <= 1 << 22  # latency-bound: narrow tiles, few warps
        row += [GemvTiles(1, bn, bk, 1) for bn in (2, 4, 8) for bk in (256, 512, 1024) if is_small and bucket <= 8]
        small = [GemvTiles(bucket, bn, bk, w, ahead=a) for bn, bk, w, a in itertools.product((1, 2, 4), (64, 128, 256,
                 512, 1024), (1, 2), (False, True)) if is_small and bucket * bn * bk <= 8192 * w] + [QuantTiles(16, *t)
                 for t in itertools.product((16, 32), (128, 256), (1, 2), (2, 4), (1, 2)) if is_small and bucket >= 8]
        small += [QuantTiles(*t, 4, s) for *t, s in itertools.product((16, 32, 64), (16, 32, 64), (128, 256), (1, 2),
                  (2, 3)) if is_small and 16 <= t[0] <= bucket]  # past 8 rows: narrow on both sides
        return list(dict.fromkeys([tensor_core_tiles(bucket, n, k, weights, NUM_SMS), *row, *gemv, *wide, *small]))
    if bucket > FEW_ROWS:
        return many_row_candidates(bucket, n, k)
    if n > 8192:  # the lm_head: dot tiles, no split
        return [SkinnyConfig(bn, bk, 1, True, warps, stages) for (bn, bk, warps), stages in itertools.product(
            [(64, 128, 4), (128, 128, 8), (32, 512, 4), (64, 256, 4)], (2, 3, 4))]
    return few_row_candidates(bucket, n, k)


def compile_key(m: int, k: int, config: Config) -> tuple:
    """What Triton compiles a variant for (M and N are no specialization keys; the quantized kernels' K is)."""
    return (config, 0 if config.use_dot else row_bucket(m), k % (config.block_k * config.split_k) == 0) if isinstance(
        config, SkinnyConfig) else (config, k)


def _compile_worker(jobs: list[tuple[str, int, int, Config]]) -> None:
    """Runs its share of the variants once (on 256 weight rows: N is no specialization key) into Triton's cache."""
    for weights, m, k, config in jobs:
        with contextlib.suppress(Exception):
            with_config(config, weights)(torch.randn(m, k, dtype=DTYPE, device=DEVICE), random_weight(256, k, weights))


def precompile(weights: str, shapes: dict[str, tuple[int, int]], rows: tuple[int, ...], num_workers: int) -> None:
    """Each distinct variant the sweep runs compiled once, spread over `num_workers` processes."""
    jobs = {compile_key(m, k, c): (weights, m, k, c) for n, k in shapes.values() for m in rows
            for c in candidates(weights, row_bucket(m), n, k)}
    with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
        pool.map(_compile_worker, [list(jobs.values())[i::num_workers] for i in range(num_workers)])


def sweep_row(weights: str, name: str, m: int, copies: list[Weight], configs: list[Config | None]) -> dict:
    """The baseline (`cublas_us`: cuBLAS, the tensor-core rule) and each config (None: the table's or the rule's) at
    one shape and row count, the fastest under `skinny_us`; a config off by more than MAX_ERROR is dropped."""
    (n, k), x = SHAPES[name], torch.randn(m, SHAPES[name][1], dtype=DTYPE, device=DEVICE)
    baseline_us = rotated_us_per_call(baseline(weights, m, n, k), x, copies)
    row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": round(baseline_us, 2), "configs": []}
    for config in configs:
        try:
            err = relative_error(fn := with_config(config, weights), x, copies[0])
            us = rotated_us_per_call(fn, x, copies) if err < MAX_ERROR[weights] else float("inf")
        except Exception as error:  # noqa: BLE001 - a config that fails is reported, not fatal
            err, us = float("nan"), float("inf")
            print(f"{name} M={m} {config}: {type(error).__name__}: {str(error)[:300]}", flush=True)
        row["configs"].append(getattr(config, "__dict__", {}) | {"code": config_literal(config), "us": us, "err": err})
    row["best"] = best = min(row["configs"], key=lambda c: c["us"])
    row["skinny_us"], row["is_kernel_faster"] = best["us"], weights != "bf16" or best["us"] <= MIN_GAIN * baseline_us
    print(f"{name:11s} M={m:3d} baseline {baseline_us:7.2f} us, best {best['us']:7.2f} {best['code']}", flush=True)
    return row


def sweep(weights: str, shapes: dict[str, tuple[int, int]], rows: tuple[int, ...], configs: Callable[..., list],
          budget_s: float, out: Path | None) -> list[dict]:
    """`configs(weights, row bucket, N, K)` per shape and M; rows so far go to `out` after each (kept if killed)."""
    start, done = time.perf_counter(), []
    for name, (n, k) in shapes.items():
        copies = weight_copies(n, k, weights)  # one shape's copies at a time
        for m in (m for m in rows if configs(weights, row_bucket(m), n, k)):
            if time.perf_counter() - start > budget_s:
                print(f"budget spent: stopped before {name} M={m}", flush=True)
                return done
            done.append(sweep_row(weights, name, m, copies, configs(weights, row_bucket(m), n, k)))
            if out is not None:
                out.write_text(json.dumps(done))
        torch.cuda.empty_cache()
    return done


def config_literal(config: Config | None) -> str:
    """The config as the tables write it (gpu/kernels/skinny_gemm_configs.py's helpers, quant_gemm_configs.py's)."""
    if not isinstance(config, SkinnyConfig):
        return repr(config)
    if not config.use_dot:
        return f"_fma({config.block_n}, {config.block_k}, {config.split_k}, num_warps={config.num_warps})"
    return (f"_dot({config.block_n}, {config.block_k}, {config.split_k}, num_warps={config.num_warps}, "
            f"num_stages={config.num_stages}, block_m={config.block_m}{', use_tma=True' if config.use_tma else ''})")


def table_lines(weights: str, rows: list[dict]) -> list[str]:
    """`([kind,] bucket, N, K): config,` per swept row: the fastest config, or None where cuBLAS was not beaten."""
    return [f"({'' if weights == 'bf16' else repr(weights) + ', '}{row_bucket(row['m'])}, {row['n']}, {row['k']}): "
            f"{row['best']['code'] if row['is_kernel_faster'] else None}," for row in rows]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.kernels.skinny_gemm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every candidate config instead of the table")
    parser.add_argument("--weights", choices=["bf16", "fp8", "int4"], default="bf16")
    parser.add_argument("--rows", type=int, nargs="+", help="default: every row bucket's widest with --sweep")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), help=f"default: {QUANT_SHAPES} quantized")
    parser.add_argument("--workers", type=int, default=15, help="processes that compile the sweep's kernels")
    parser.add_argument("--budget-s", type=float, default=200.0, help="the sweep stops starting shapes after this")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    is_bf16 = args.weights == "bf16"
    shapes = {name: SHAPES[name] for name in args.shapes or (
        [n for n in SHAPES if not n.startswith(("q8b", "smol"))] if is_bf16 else QUANT_SHAPES)}
    rows = tuple(args.rows or (SWEEP_ROWS[:4] if not is_bf16 else SWEEP_ROWS if args.sweep else COMPARE_ROWS))
    kind = "skinny-gemm" if is_bf16 else f"quant-gemm-{args.weights}"
    result: dict[str, object] = {"kind": kind, "torch": torch.__version__}
    if args.sweep:
        precompile(args.weights, shapes, rows, args.workers)
        swept = sweep(args.weights, shapes, rows, candidates, args.budget_s, args.out and Path(args.out + ".partial"))
        result |= {"kind": f"{kind}-sweep", "rows": swept, "table": table_lines(args.weights, swept)}
        print("\n".join(table_lines(args.weights, swept)), flush=True)
    else:  # the table's or the rule's config
        result["rows"] = sweep(args.weights, shapes, rows, lambda *_: [None], float("inf"), None)
    write_result(args.out, result, "bench.kernels.skinny_gemm", argv)


if __name__ == "__main__":
    main()
