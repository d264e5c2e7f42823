"""Attention backends side by side, per step phase: Triton against flash-attn (FA4), on a CUDA machine.

Qwen3-0.6B heads (16 query heads, 8 KV heads of 128, bf16, 16-token blocks, shuffled block tables,
random caches, input sets rotated past 4x L2). Each case is first checked against the torch
reference (relative Frobenius error), then timed two ways:
- `graph_us`: one call's device time, from replays of a CUDA graph of 20 calls, as a decode step
  (and, for Triton, a step with prefill) runs inside a graph;
- `eager_us`: one call's time when called back to back from Python (host launch cost included),
  as a step that runs eagerly pays it.
Phases: decode (batch x context), prefill (fresh prompts), mixed (one prompt chunk beside decode
rows, as the offline and serving workloads' steps with prefill are). Writes JSON to --out and
prints a table; prefill rates as TFLOP/s of causal attention (4 * q * k * d per head, halved).
"""

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.attention_bench import BLOCK_SIZE, DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, SCALE
from bench.common import write_result
from bench.cuda_timing import graph_ms
from gpu.attention import torch_ref
from gpu.attention.backend import backend_named
from gpu.attention.metadata import AttentionMetadata

CALLS_PER_GRAPH = 20
# (phase, label, rows as (query_len, context_len))
CASES = [
    ("decode", "1 x 1k", [(1, 1024)]),
    ("decode", "16 x 1k", [(1, 1024)] * 16),
    ("decode", "64 x 4k", [(1, 4096)] * 64),
    ("decode", "256 x 1k", [(1, 1024)] * 256),
    ("decode", "256 x 100-2048", "uniform"),
    ("prefill", "1 x 1024 fresh", [(1024, 1024)]),
    ("prefill", "4 x 1024 fresh", [(1024, 1024)] * 4),
    ("prefill", "1 x 8192 fresh", [(8192, 8192)]),
    ("prefill", "512 chunk after 3k prefix", [(512, 3584)]),
    ("mixed", "2048 chunk + 255 decode x 1k", [(2048, 2048)] + [(1, 1024)] * 255),
    ("mixed", "1024 chunk + 63 decode x 1k", [(1024, 1024)] + [(1, 1024)] * 63),
    ("mixed", "8 x 1024 chunks + 128 decode", [(1024, 1024)] * 8 + [(1, 1024)] * 128),
]


def rows_of(spec: object) -> list[tuple[int, int]]:
    if spec == "uniform":
        gen = torch.Generator().manual_seed(0)
        return [(1, int(c)) for c in torch.randint(100, 2049, (256,), generator=gen)]
    return list(spec)  # type: ignore[arg-type]


class Inputs:
    """Caches and rotating (query, block table) sets over disjoint shuffled blocks."""

    def __init__(self, rows: list[tuple[int, int]]) -> None:
        query_lens, context_lens = [q for q, _ in rows], [c for _, c in rows]
        blocks = [-(-c // BLOCK_SIZE) for c in context_lens]
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
        set_bytes = sum(context_lens) * NUM_KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize
        self.num_sets = max(1, min(16, math.ceil(4 * l2 / set_bytes)))
        num_blocks = self.num_sets * sum(blocks)
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
        self.v_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
        pool = torch.randperm(num_blocks).tolist()
        width, tables = max(blocks), []
        for s in range(self.num_sets):
            used, table = s * sum(blocks), []
            for n in blocks:
                table.append(pool[used : used + n] + [0] * (width - n))
                used += n
            tables.append(table)
        self.block_tables = torch.tensor(tables, dtype=torch.int32, device="cuda")
        num_tokens = sum(query_lens)
        self.queries = torch.randn(self.num_sets, num_tokens, NUM_HEADS, HEAD_DIM, device="cuda").to(DTYPE)
        starts = [0, *itertools.accumulate(query_lens)]
        self.meta = [AttentionMetadata(
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device="cuda"),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device="cuda"),
            block_tables=self.block_tables[s], max_query_len=max(query_lens), max_context_len=max(context_lens),
            is_decode_only=max(query_lens) == 1,
        ) for s in range(self.num_sets)]
        self.calls = itertools.count()
        self.query_lens, self.context_lens = query_lens, context_lens

    def runner(self, backend: object) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            i = next(self.calls) % self.num_sets
            return backend.forward(self.queries[i], self.k_cache, self.v_cache, self.meta[i], SCALE)
        return run

    def flops(self) -> float:
        return sum(4 * q * (c - q / 2) * HEAD_DIM * NUM_HEADS for q, c in zip(self.query_lens, self.context_lens,
                                                                                 strict=True))

    def kv_bytes(self) -> int:
        return sum(self.context_lens) * NUM_KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize


def rel_error(inputs: Inputs, backend: object) -> float:
    m = inputs.meta[0]
    out = backend.forward(inputs.queries[0], inputs.k_cache, inputs.v_cache, m, SCALE)
    with torch.device("cuda"):
        ref = torch_ref.paged_attention(inputs.queries[0], inputs.k_cache, inputs.v_cache, m.query_start_loc,
                                        m.context_lens, m.block_tables, SCALE)
    if out.isnan().any():
        return float("nan")
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def eager_us(run: Callable[[], object], calls: int = 50) -> float:
    for _ in range(5):
        run()
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(samples)[2]


def measure(phase: str, label: str, rows: list[tuple[int, int]], backends: dict[str, object]) -> dict:
    inputs = Inputs(rows)
    row: dict = {"phase": phase, "case": label, "rows": len(rows), "tokens": sum(inputs.query_lens),
                 "kv_bytes": inputs.kv_bytes(), "flops": inputs.flops()}
    for name, backend in backends.items():
        entry: dict = {}
        try:
            entry["rel_err"] = round(rel_error(inputs, backend), 5)
            entry["eager_us"] = round(eager_us(inputs.runner(backend)), 2)
            entry["graph_us"] = round(graph_ms(inputs.runner(backend), CALLS_PER_GRAPH) * 1e3, 2)
        except Exception as error:  # noqa: BLE001 - a backend that cannot run a case is reported, not fatal
            entry["error"] = repr(error)[:300]
        row[name] = entry
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--backends", default="triton,flash-attn")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    backends = {name: backend_named(name) for name in args.backends.split(",")}
    results = []
    for phase, label, spec in CASES:
        results.append(measure(phase, label, rows_of(spec), backends))
        print(json.dumps(results[-1]), flush=True)
    write_result(args.out, {"kind": "attention-backends", "torch": torch.__version__, "results": results},
                 "bench.attention_backends", argv)
    print_table(results, list(backends))


def print_table(results: list[dict], names: list[str]) -> None:
    print("| phase | case | " + " | ".join(f"{n} graph us | {n} eager us | {n} err" for n in names) + " |")
    for r in results:
        cells = []
        for n in names:
            e = r[n]
            cells += [str(e.get("graph_us", "-")), str(e.get("eager_us", "-")), str(e.get("rel_err", e.get("error")))]
        print(f"| {r['phase']} | {r['case']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
