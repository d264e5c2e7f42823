"""The fused MoE kernels (routing, then the grouped GEMMs, or at a few rows the decode GEMVs) at the MoE benchmarks'
expert shapes per row count M: microseconds per block from router logits to output, the median replay of a CUDA graph
of calls (bench/kernels/timing.py) each routing its own random logits (the experts come from HBM, as in a step), and
the ideal: the bytes of the experts M rows are expected to reach, x and the output, at the copy bandwidth measured in
the same run, or the FLOPs at the measured matmul rate where longer. bf16 (the configs serve the quantized formats too).
`--sweep` makes gpu/kernels/fused_moe_configs.py's TABLES lines for a GPU, and DECODE_TABLES lines at decode rows.

    python -m bench.kernels.fused_moe [--sweep] [--rows 1 2 64] --out result.json  # the table's or rule's [fastest]
"""

import argparse
import itertools
import sys
from dataclasses import asdict, replace
from functools import partial
from typing import Any, TypeVar

import torch

from bench.common import write_result
from bench.kernels.timing import DEVICE, DTYPE, graph_us_per_call
from bench.roofline import DeviceLimits, measure_limits
from gpu.kernels import fused_moe_configs as configs
from gpu.kernels.fused_moe import fused_experts
from gpu.kernels.moe_route import route
from gpu.layers.moe import Activation, Routing

# (experts, top_k, hidden, intermediate, activation): the routed experts of one layer (gpt-oss's with biases)
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, "silu"), "gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu")}
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
CALLS_PER_GRAPH = 16
MIN_GAIN = 0.97
Config = TypeVar("Config", configs.MoeConfig, configs.DecodeConfig)


class Block:
    """One layer's experts and CALLS_PER_GRAPH routings of `rows` rows: a call routes and runs one of them."""

    def __init__(self, shape: str, rows: int) -> None:
        num_experts, top_k, hidden, intermediate, act = SHAPES[shape]
        randn = partial(torch.randn, device=DEVICE, dtype=DTYPE, generator=torch.Generator(DEVICE).manual_seed(rows))
        self.gate_up = randn(num_experts, 2 * intermediate, hidden) * hidden**-0.5
        self.down = randn(num_experts, hidden, intermediate) * intermediate**-0.5
        has_bias = act != "silu"
        self.gate_up_bias = torch.zeros(num_experts, 2 * intermediate, device=DEVICE, dtype=DTYPE) if has_bias else None
        self.down_bias = torch.zeros(num_experts, hidden, device=DEVICE, dtype=DTYPE) if has_bias else None
        self.x, self.logits = randn(rows, hidden), [randn(rows, num_experts) for _ in range(CALLS_PER_GRAPH)]
        self.act = Activation(act, 1.702, 7.0) if has_bias else Activation("silu")
        self.routing, self.rows, self.shape = Routing(num_experts, top_k), rows, SHAPES[shape]

    def us_per_call(self, config: configs.MoeConfig | configs.DecodeConfig | None) -> float:
        """Per call, over a graph of CALLS_PER_GRAPH calls, each routing its logits as a step does (PDL)."""
        def call(logits: torch.Tensor) -> torch.Tensor:
            weights, ids = route(logits, self.routing, None, use_pdl=True)
            return fused_experts(self.x, self.gate_up, self.down, weights, ids, self.act, self.gate_up_bias,
                                 self.down_bias, config=config, use_pdl=True)
        return graph_us_per_call([partial(call, logits) for logits in self.logits])

    def ideal_us(self, limits: DeviceLimits) -> float:
        num_experts, top_k, hidden, intermediate, _ = self.shape
        reached = num_experts * (1 - (1 - top_k / num_experts) ** self.rows)
        num_bytes = reached * 3 * hidden * intermediate * 2 + 2 * self.rows * hidden * 2
        flops = 2 * self.rows * top_k * 3 * hidden * intermediate
        return 1e6 * max(num_bytes / limits.copy_bytes_per_s, flops / limits.matmul_flops_per_s)

    def fastest(self, best: Config, best_us: float, name: str, values: list[Any]) -> tuple[Config, float]:
        """The fastest of `best` (measured at `best_us`) and `best` with its part `name` set to each of `values`."""
        for candidate in [replace(best, **{name: value}) for value in values]:
            try:
                us = self.us_per_call(candidate)
            except Exception as exc:  # noqa: BLE001 - a config the GPU cannot run (resources): skip it
                print(f"  {self.rows} {candidate}: {type(exc).__name__}", flush=True)
                continue
            best, best_us = (candidate, us) if us < best_us else (best, best_us)
        return best, best_us


def sweep_config(block: Block, config: Config, us: float) -> tuple[Config, float]:
    """Each part of the config in turn, beside the fastest parts before it. Grouped GEMMs: the row tile, then per GEMM
    column/K tiles (down's twice as wide), groups, warps, stages. Decode kernels (gate/up, then down): tiles of 4..64
    columns by 128.. up to K's power of two, 1k-16k elements and 8-64 a thread (16-byte loads, sums in registers),
    256-2048 programs, down's slots in groups dividing top k; then the fastest tile's stages where K takes several."""
    _, top_k, hidden, intermediate, _ = block.shape
    if isinstance(config, configs.MoeConfig):
        wide = {scale: [configs.GemmTiles(n * scale, k, g, w, s) for n, k, g, w, s in itertools.product(
            (32, 64, 128), (64, 128), (1, 8), (4, 8), (3, 4)) if not (n == 32 and w == 8)] for scale in (1, 2)}
        for name, values in (("block_m", [16, 32, 64, 128]), ("gate_up", wide[1]), ("down", wide[2])):
            config, us = block.fastest(config, us, name, values)
        return config, us
    for name, units, columns, k, slots in (("gate_up", block.rows * top_k, intermediate, hidden, 1),
                                           ("down", block.rows, hidden, intermediate, top_k)):
        tiles = [configs.DecodeTiles(n, bk, w, slot_groups=g) for n, bk, w, g in itertools.product(
            (4, 8, 16, 32, 64), (128, 256, 512, 1024, 2048, 4096), (2, 4, 8), (1, 2, 4, 8))
            if bk < 2 * k and 1024 <= n * bk <= 16384 and 8 <= n * bk // (32 * w) <= 64 and slots % g == 0
            and 256 <= units * -(-columns // n) * g <= 2048]
        config, us = block.fastest(config, us, name, tiles)
        t = getattr(config, name)
        config, us = block.fastest(config, us, name, [replace(t, num_stages=n) for n in (2, 3, 4) if t.block_k < k])
    return config, us


def measure(shape: str, rows: int, limits: DeviceLimits, sweep: bool) -> dict[str, object]:
    """The figures of `shape` at `rows` rows; with `sweep` the fastest config's, and its table line if it wins."""
    block = Block(shape, rows)
    num_experts, top_k, hidden, intermediate, _ = block.shape
    device, is_decode = torch.cuda.get_device_name(), configs.uses_decode_path(rows, top_k, num_experts)
    chosen = (configs.decode_config(rows, top_k, intermediate, hidden, device) if is_decode
              else configs.config_for(rows, num_experts, top_k, intermediate, hidden, device))
    measured, ideal = block.us_per_call(None), block.ideal_us(limits)
    row: dict[str, object] = {"shape": shape, "weights": "bf16", "rows": rows, "us": round(measured, 2),
                              "ideal_us": round(ideal, 2), "share_of_ideal": round(ideal / measured, 4),
                              "config": asdict(chosen)}
    if sweep:
        best, us = sweep_config(block, chosen, measured)
        key = (rows, top_k) if is_decode else (configs.row_bucket(rows), num_experts)
        row |= {"best_us": round(us, 2), "best_share_of_ideal": round(ideal / us, 4), "best_config": asdict(best),
                "table_line": f"{(*key, intermediate, hidden)}: {best}," if us <= MIN_GAIN * measured else None}
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.kernels.fused_moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    p.add_argument("--sweep", action="store_true", help="time candidate configs too; print the fastest per bucket")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    limits = measure_limits(DEVICE, DTYPE)
    rows = [measure(shape, m, limits, args.sweep) for shape in args.shapes for m in args.rows]
    result: dict[str, object] = {"kind": "fused_moe", "limits": limits.figures(), "rows": rows}
    if args.sweep:
        result["table"] = table = [str(row["table_line"]) for row in rows if row["table_line"]]
        print("\n".join(table))
    write_result(args.out, result, "bench.kernels.fused_moe", argv)


if __name__ == "__main__":
    main()
