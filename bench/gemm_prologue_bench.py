"""The skinny GEMM's prologues (gpu/kernels/skinny_gemm.py) against the elementwise kernel then the product.

Per decode shape of Qwen3-0.6B that a prologue serves (norm -> q/k/v and gate/up, SiLU-and-mul -> down) and rows
1..16: microseconds per pair "elementwise kernel + product" (the separate kernels, as gpu/layers/linear.py runs them
with prologues off, the product with the table's config) against one fused call, per candidate config of the fused
kernel (first the one the GPU's prologue rule gives, else the table's).
Each figure is the median replay of a CUDA graph of many calls, programmatic dependent launches on as in a decode
step, rotating over copies of the weight totalling 256 MB so the weights come from HBM (bench/skinny_gemm_bench.py's
method). bf16.

    python -m bench.gemm_prologue_bench --out result.json
"""

import argparse
import sys
from collections.abc import Callable

import torch

from bench.common import write_result
from bench.skinny_gemm_bench import DEVICE, DTYPE, SHAPES, graph_us_per_call, weight_copies
from gpu.kernels.rms_norm import rms_norm
from gpu.kernels.silu_and_mul import silu_and_mul
from gpu.kernels.skinny_gemm import (
    SkinnyConfig,
    config_for,
    prologue_config,
    skinny_gemm,
    skinny_gemm_rms_norm,
    skinny_gemm_silu_and_mul,
)

PROLOGUE_OF = {"qkv": "norm", "gate_up": "norm", "down": "silu"}
ROWS = (1, 2, 4, 8, 16)
EPS = 1e-6


def candidates(m: int, n: int, k: int, kind: str) -> list[SkinnyConfig]:
    """The rule's (or the table's) config, then the pointer kernel's dot and (up to 8 rows) fma paths at the sizes
    the tables use."""
    table = prologue_config(m, k, kind, DEVICE) or config_for(m, n, k, DEVICE)
    others = [SkinnyConfig(64, 256, use_dot=True, num_stages=4), SkinnyConfig(32, 256, use_dot=True, num_stages=3),
              SkinnyConfig(64, 128, split_k=2, use_dot=True, num_stages=4)]
    if m <= 8:
        others += [SkinnyConfig(4, 1024, num_stages=1), SkinnyConfig(8, 512, num_stages=1)]
    return [table] + [c for c in others if c != table]


def pair_fns(kind: str, m: int, k: int, config: SkinnyConfig) -> tuple[torch.Tensor, Callable, Callable]:
    """(x, separate(x, w), fused(x, w)) for one prologue kind; the residual and norm weight live in the closures."""
    if kind == "norm":
        x = torch.randn(m, k, dtype=DTYPE, device=DEVICE)
        residual = torch.randn_like(x)
        norm_weight = torch.rand(k, dtype=DTYPE, device=DEVICE) + 0.5

        def separate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return skinny_gemm(rms_norm(x, norm_weight, EPS, residual, use_pdl=True)[0], w, None, config, True)

        def fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return skinny_gemm_rms_norm(x, residual, norm_weight, EPS, w, None, config, True)[0]

        return x, separate, fused
    gate_up = torch.randn(m, 2 * k, dtype=DTYPE, device=DEVICE)
    return (gate_up, lambda x, w: skinny_gemm(silu_and_mul(x, use_pdl=True), w, None, config, True),
            lambda x, w: skinny_gemm_silu_and_mul(x, w, None, config, True))


def measure(names: list[str], rows: tuple[int, ...]) -> list[dict]:
    results = []
    for name in names:
        n, k = SHAPES[name]
        weights = weight_copies(n, k)
        kind = PROLOGUE_OF[name]
        for m in rows:
            configs = candidates(m, n, k, kind)
            x, separate, _ = pair_fns(kind, m, k, config_for(m, n, k, DEVICE))
            row = {"shape": name, "prologue": kind, "rows": m, "separate_us": round(graph_us_per_call(
                separate, x, weights), 2), "fused_us": {}}
            for config in configs:
                x, _, fused = pair_fns(kind, m, k, config)
                row["fused_us"][repr(config)] = round(graph_us_per_call(fused, x, weights), 2)
            best = min(row["fused_us"].values())
            row["first_fused_us"] = row["fused_us"][repr(configs[0])]
            row["best_fused_us"] = best
            print(f"{name:8s} {kind:5s} rows {m:2d}: separate {row['separate_us']:6.2f} us, fused (first config) "
                  f"{row['first_fused_us']:6.2f}, best fused {best:6.2f}", flush=True)
            results.append(row)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(PROLOGUE_OF), default=list(PROLOGUE_OF))
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    results = measure(args.shapes, tuple(args.rows))
    if args.out:
        write_result(args.out, {"kind": "gemm-prologues", "results": results}, "bench.gemm_prologue_bench",
                     sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
