"""The fused MoE kernels (routing, sorting and the two grouped GEMMs) against their ideal, per row count, at the
expert shapes of the MoE benchmarks; `--sweep` makes gpu/kernels/fused_moe_configs.py's TABLES lines for a GPU.

Per shape and rows M: microseconds per MoE block from its router logits to its output, and its ideal: the bytes it
must move (the routed experts M rows are expected to reach, x and the output) over the copy bandwidth measured in the
same run, or its FLOPs over the measured matmul rate where that is longer. Each figure is the median replay of a CUDA
graph of calls (bench/kernels/timing.py) that each route their own random logits, so the experts a call reaches come
from HBM, as in a step. bf16 activations and weights: the table's configs serve the quantized experts' formats too.

    python -m bench.kernels.fused_moe --out result.json                  # the rule's (or the table's) configs
    python -m bench.kernels.fused_moe --sweep --rows 1 8 64 --out s.json  # the fastest config per bucket
"""

import argparse
import itertools
import sys
from dataclasses import asdict, replace
from functools import partial

import torch

from bench.common import write_result
from bench.kernels.timing import DEVICE, DTYPE, graph_us_per_call
from bench.roofline import DeviceLimits, measure_limits
from gpu.kernels.fused_moe import fused_experts
from gpu.kernels.fused_moe_configs import GemmTiles, MoeConfig, config_for, row_bucket
from gpu.kernels.moe_route import route
from gpu.layers.moe import Activation, Routing

# (experts, top_k, hidden, intermediate, activation): the routed experts of one layer (gpt-oss's with biases)
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, "silu"), "gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu")}
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
CALLS_PER_GRAPH = 16
MIN_GAIN = 0.97


class Block:
    """One layer's experts and CALLS_PER_GRAPH routings of `rows` rows: a call routes and runs one of them."""

    def __init__(self, shape: str, rows: int) -> None:
        num_experts, top_k, hidden, intermediate, act = SHAPES[shape]
        generator = torch.Generator(DEVICE).manual_seed(rows)
        self.gate_up = torch.randn(num_experts, 2 * intermediate, hidden, device=DEVICE, dtype=DTYPE,
                                   generator=generator) * hidden**-0.5
        self.down = torch.randn(num_experts, hidden, intermediate, device=DEVICE, dtype=DTYPE,
                                generator=generator) * intermediate**-0.5
        has_bias = act != "silu"
        self.gate_up_bias = torch.zeros(num_experts, 2 * intermediate, device=DEVICE, dtype=DTYPE) if has_bias else None
        self.down_bias = torch.zeros(num_experts, hidden, device=DEVICE, dtype=DTYPE) if has_bias else None
        self.x = torch.randn(rows, hidden, device=DEVICE, dtype=DTYPE, generator=generator)
        self.logits = [torch.randn(rows, num_experts, device=DEVICE, dtype=DTYPE, generator=generator)
                       for _ in range(CALLS_PER_GRAPH)]
        self.routing = Routing(num_experts, top_k)
        self.act = Activation(act, 1.702, 7.0) if act != "silu" else Activation("silu")
        self.rows, self.shape = rows, SHAPES[shape]

    def call(self, index: int, config: MoeConfig | None) -> torch.Tensor:
        """As a step runs it (programmatic dependent launches)."""
        weights, ids = route(self.logits[index], self.routing, None, use_pdl=True)
        return fused_experts(self.x, self.gate_up, self.down, weights, ids, self.act, self.gate_up_bias,
                             self.down_bias, config=config, use_pdl=True)

    def us_per_call(self, config: MoeConfig | None) -> float:
        """Per call, over a graph of CALLS_PER_GRAPH calls, each its own routing."""
        return graph_us_per_call([partial(self.call, index, config) for index in range(CALLS_PER_GRAPH)])

    def ideal_us(self, limits: DeviceLimits) -> float:
        num_experts, top_k, hidden, intermediate, _ = self.shape
        expert_bytes = 3 * hidden * intermediate * 2
        reached = num_experts * (1 - (1 - top_k / num_experts) ** self.rows)
        num_bytes = reached * expert_bytes + 2 * self.rows * hidden * 2
        flops = 2 * self.rows * top_k * 3 * hidden * intermediate
        return 1e6 * max(num_bytes / limits.copy_bytes_per_s, flops / limits.matmul_flops_per_s)


def candidates(config: MoeConfig) -> list[MoeConfig]:
    """The rule's config and its neighbours: other row tiles, then per GEMM other column/K tiles, warps and stages."""
    tiles = [GemmTiles(n, k, g, w, s) for n, k, g, w, s in itertools.product(
        (32, 64, 128), (64, 128), (1, 8), (4, 8), (3, 4)) if not (n == 32 and w == 8)]
    down = [replace(t, block_n=2 * t.block_n) for t in tiles]
    found = [replace(config, block_m=m) for m in (16, 32, 64, 128)]
    found += [replace(config, gate_up=t) for t in tiles] + [replace(config, down=t) for t in down]
    return list(dict.fromkeys(found))


def measure(shape: str, rows: int, limits: DeviceLimits, sweep: bool) -> tuple[dict[str, object], str | None]:
    """(the figures of `shape` at `rows` rows; with `sweep`, the TABLES line of the fastest config where it beats the
    rule's by MIN_GAIN, else None)."""
    block = Block(shape, rows)
    num_experts, top_k, hidden, intermediate, _ = block.shape
    chosen = config_for(rows, num_experts, top_k, intermediate, hidden, torch.cuda.get_device_name())
    measured = block.us_per_call(None)
    ideal = block.ideal_us(limits)
    row: dict[str, object] = {"shape": shape, "weights": "bf16", "rows": rows, "us": round(measured, 2),
                              "ideal_us": round(ideal, 2), "share_of_ideal": round(ideal / measured, 4),
                              "config": asdict(chosen)}
    line = None
    if sweep:
        best, best_us = chosen, measured
        for candidate in candidates(chosen):
            try:
                us = block.us_per_call(candidate)
            except Exception as exc:  # noqa: BLE001 - a config the GPU cannot run (resources): skip it
                print(f"  {shape} {rows} {candidate}: {type(exc).__name__}", flush=True)
                continue
            if us < best_us:
                best, best_us = candidate, us
        row |= {"best_us": round(best_us, 2), "best_share_of_ideal": round(ideal / best_us, 4),
                "best_config": asdict(best)}
        if best_us <= MIN_GAIN * measured:
            line = (f"({row_bucket(rows)}, {num_experts}, {intermediate}, {hidden}): MoeConfig({best.block_m}, "
                    f"{best.gate_up}, {best.down}),")
    print(row, flush=True)
    return row, line


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.kernels.fused_moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    p.add_argument("--sweep", action="store_true", help="time candidate configs too; print the fastest per bucket")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    limits = measure_limits(DEVICE, DTYPE)
    measured = [measure(shape, m, limits, args.sweep) for shape in args.shapes for m in args.rows]
    table = [line for _, line in measured if line is not None]
    result: dict[str, object] = {"kind": "fused_moe", "limits": limits.figures(), "rows": [row for row, _ in measured]}
    if args.sweep:
        result["table"] = table
        print("\n".join(table))
    write_result(args.out, result, "bench.kernels.fused_moe", argv)


if __name__ == "__main__":
    main()
