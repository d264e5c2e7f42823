"""Attention microbenchmark for the Triton kernels; run on a CUDA machine, writes JSON to --out.

Decode attention at (batch, context) = (1, 1k), (16, 1k), (64, 4k), (256, 1k) with Qwen3-0.6B-like
heads (16 query heads, 8 KV heads, head_dim 128, bf16, block 16), timed eagerly and as CUDA-graph
replays; achieved bandwidth (bytes of K/V + block table read, q read, out written) as a share of
the same GPU's device-to-device copy bandwidth (bytes read + written), measured here. Peers: the
torch reference (gpu/attention/torch_ref.py) and torch SDPA over contiguous (unpaged) KV. A small
sweep of launch configurations and split counts says whether the defaults are the best ones.
Then the prefill kernel on PREFILL_CASES (fresh prompts and a chunk after a cached prefix) as CUDA-graph replays,
with a sweep of its launch configurations, against SDPA (causal, contiguous) on the fresh ones.
Inputs are random; several input sets rotate where one set would fit in L2.

    python -m bench.attention_bench --out result.json
"""

import argparse
import itertools
import math
import sys

import torch
import triton

from bench.bench_model import QWEN3_0P6B
from bench.common import write_result
from bench.cuda_timing import graph_ms, median_ms
from bench.device_limits import measure_copy_bytes_per_s
from gpu.attention import torch_ref
from gpu.kernels.decode_attention import DecodeConfig, choose_num_splits, decode_attention
from gpu.kernels.prefill_attention import PrefillConfig, prefill_attention

NUM_HEADS, NUM_KV_HEADS = int(QWEN3_0P6B["num_attention_heads"]), int(QWEN3_0P6B["num_key_value_heads"])
HEAD_DIM, BLOCK_SIZE = int(QWEN3_0P6B["head_dim"]), 16
DTYPE = torch.bfloat16
DECODE_SHAPES = [(1, 1024), (16, 1024), (64, 4096), (256, 1024)]
DECODE_TILE_SWEEP = [(64, 4, 2), (32, 4, 3), (64, 4, 3), (128, 4, 2), (64, 8, 2), (32, 4, 2), (128, 8, 3)]
SPLIT_SWEEP = [1, 2, 4, 8, 16, 32]
PREFILL_SWEEP = [  # (block_m, block_n, num_warps, num_stages)
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 8, 3), (64, 32, 4, 3),
    (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 8, 3),
    (128, 64, 4, 3), (256, 64, 8, 2), (256, 32, 8, 3),
]
# (rows, new tokens per row, cached prefix per row): fresh prompts of the serving and offline shapes, one long
# prompt, and a chunk after a cached prefix (a chunked prefill's second piece).
PREFILL_CASES = [(4, 1024, 0), (8, 1024, 0), (1, 8192, 0), (1, 512, 3072)]
CALLS_PER_GRAPH = 20
SCALE = HEAD_DIM**-0.5


class DecodeInputs:
    """Caches and num_sets rotating (query, block table) sets over disjoint, shuffled blocks."""

    def __init__(self, batch: int, context: int) -> None:
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
        set_bytes = batch * context * NUM_KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize
        self.num_sets = max(1, min(64, math.ceil(4 * l2_bytes / set_bytes)))
        blocks_per_row = context // BLOCK_SIZE
        num_blocks = self.num_sets * batch * blocks_per_row
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
        self.v_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
        tables = torch.randperm(num_blocks, device="cuda").view(self.num_sets, batch, blocks_per_row)
        self.block_tables = tables.to(torch.int32)
        self.queries = torch.randn(self.num_sets, batch, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
        self.context_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        self.calls = itertools.count()

    def run(self, config: DecodeConfig | None = None) -> torch.Tensor:
        i = next(self.calls) % self.num_sets
        return decode_attention(
            self.queries[i], self.k_cache, self.v_cache, self.block_tables[i], self.context_lens, SCALE, config=config
        )

    def bytes_moved(self) -> int:
        batch, blocks_per_row = self.block_tables.shape[1:]
        kv = batch * blocks_per_row * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize
        q_and_out = 2 * batch * NUM_HEADS * HEAD_DIM * DTYPE.itemsize
        return kv + q_and_out + batch * blocks_per_row * 4


def decode_case(batch: int, context: int, copy_bps: float) -> dict:
    inputs = DecodeInputs(batch, context)
    nbytes = inputs.bytes_moved()

    def share(ms: float) -> dict:
        gbps = nbytes / (ms * 1e-3) / 1e9
        return {"us": round(ms * 1e3, 2), "GBps": round(gbps, 1), "pct_copy": round(100 * gbps * 1e9 / copy_bps, 1)}

    check_against_reference(inputs)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {
        "batch": batch, "context": context, "bytes": nbytes, "input_sets": inputs.num_sets,
        "default_num_splits": choose_num_splits(batch, NUM_KV_HEADS, context, sms),
        "eager": share(median_ms(lambda: inputs.run())),
        "graph": share(graph_ms(lambda: inputs.run(), CALLS_PER_GRAPH)),
        "torch_ref_us": round(time_torch_ref(inputs) * 1e3, 1),
        "sdpa_contiguous_us": time_sdpa_decode(batch, context),
        "tile_sweep": [], "split_sweep": [],
    }
    for block_n, warps, stages in DECODE_TILE_SWEEP:
        config = DecodeConfig(block_n=block_n, num_warps=warps, num_stages=stages)
        row = share(graph_ms(lambda config=config: inputs.run(config), CALLS_PER_GRAPH))
        result["tile_sweep"].append({"block_n": block_n, "num_warps": warps, "num_stages": stages, **row})
    for splits in SPLIT_SWEEP:
        row = share(graph_ms(lambda splits=splits: inputs.run(DecodeConfig(num_splits=splits)), CALLS_PER_GRAPH))
        result["split_sweep"].append({"num_splits": splits, **row})
    return result


def check_against_reference(inputs: DecodeInputs) -> None:
    """A benchmark of a wrong kernel is worthless: compare one call with the reference first."""
    q, tables = inputs.queries[0], inputs.block_tables[0]
    out = decode_attention(q, inputs.k_cache, inputs.v_cache, tables, inputs.context_lens, SCALE)
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device="cuda")
    ref = reference(q, inputs.k_cache, inputs.v_cache, starts, inputs.context_lens, tables, SCALE)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 1e-2, f"decode kernel disagrees with the reference: relative error {rel:.3e}"


def reference(*args: torch.Tensor | float) -> torch.Tensor:
    """torch_ref.paged_attention with CUDA as the default device: it builds its causal mask with
    device-less torch.arange."""
    with torch.device("cuda"):
        return torch_ref.paged_attention(*args)


def time_torch_ref(inputs: DecodeInputs) -> float:
    q, tables = inputs.queries[0], inputs.block_tables[0]
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device="cuda")
    k_cache, v_cache, lens = inputs.k_cache, inputs.v_cache, inputs.context_lens
    return median_ms(lambda: reference(q, k_cache, v_cache, starts, lens, tables, SCALE), rep_ms=300)


def time_sdpa_decode(batch: int, context: int) -> float | None:
    """torch SDPA with one query over contiguous [batch, kv_heads, context, head_dim] K/V (no paging)."""
    q = torch.randn(batch, NUM_HEADS, 1, HEAD_DIM, dtype=DTYPE, device="cuda")
    k = torch.randn(batch, NUM_KV_HEADS, context, HEAD_DIM, dtype=DTYPE, device="cuda")
    v = torch.randn_like(k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        return round(median_ms(lambda: sdpa(q, k, v, enable_gqa=True)) * 1e3, 2)
    except RuntimeError as error:  # a backend may refuse the shape; record that rather than fail
        print(f"sdpa decode {batch}x{context}: {error}", file=sys.stderr)
        return None


def prefill_case(num_rows: int, query_len: int, prefix_len: int = 0) -> dict:
    num_tokens = num_rows * query_len
    context_len = prefix_len + query_len
    blocks_per_row = -(-context_len // BLOCK_SIZE)
    shape = (num_rows * blocks_per_row, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
    v_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
    tables = torch.randperm(shape[0], device="cuda").view(num_rows, blocks_per_row).to(torch.int32)
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    starts = torch.arange(0, num_tokens + 1, query_len, dtype=torch.int32, device="cuda")
    lens = torch.full((num_rows,), context_len, dtype=torch.int32, device="cuda")
    ref = reference(q, k_cache, v_cache, starts, lens, tables, SCALE)
    out = prefill_attention(q, k_cache, v_cache, starts, lens, tables, SCALE)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 1e-2, f"prefill kernel disagrees with the reference: relative error {rel:.3e}"
    pairs = query_len * prefix_len + query_len * (query_len + 1) / 2  # (query, key) pairs, causal
    flops = num_rows * 4 * NUM_HEADS * HEAD_DIM * pairs  # QK^T and PV

    def timed(ms: float) -> dict:
        return {"us": round(ms * 1e3, 2), "TFLOPs": round(flops / (ms * 1e-3) / 1e12, 1)}

    def run(config: PrefillConfig | None = None) -> torch.Tensor:
        return prefill_attention(q, k_cache, v_cache, starts, lens, tables, SCALE, config=config)

    sweep = []
    for block_m, block_n, warps, stages in PREFILL_SWEEP:
        config = PrefillConfig(block_m, block_n, warps, stages)
        try:
            row = timed(graph_ms(lambda config=config: run(config), CALLS_PER_GRAPH))
        except Exception as error:  # e.g. out of shared memory for the largest tiles: recorded, not fatal
            print(f"prefill {config}: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)
            continue
        sweep.append({"config": str(config), **row})
    result: dict = {
        "rows": num_rows, "query_len": query_len, "prefix_len": prefix_len, "rel_err_vs_ref": rel, "flops": flops,
        "default": timed(graph_ms(run, CALLS_PER_GRAPH)), "sweep": sweep,
    }
    if prefix_len == 0:  # SDPA's causal mask has no offset for a cached prefix
        q4 = q.view(num_rows, query_len, NUM_HEADS, HEAD_DIM).transpose(1, 2).contiguous()
        k4 = torch.randn(num_rows, NUM_KV_HEADS, query_len, HEAD_DIM, dtype=DTYPE, device="cuda")
        v4 = torch.randn_like(k4)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        result["sdpa_contiguous"] = timed(median_ms(lambda: sdpa(q4, k4, v4, is_causal=True, enable_gqa=True)))
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.attention_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="where to write the JSON results")
    parser.add_argument("--prefill-only", action="store_true", help="only the prefill cases and their sweep")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    copy_bps = measure_copy_bytes_per_s(torch.device("cuda"), 2 << 30)
    results = {
        "kind": "attention", "torch": torch.__version__, "triton": triton.__version__,
        "heads": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                  "block_size": BLOCK_SIZE, "dtype": str(DTYPE)},
        "copy_GBps": round(copy_bps / 1e9, 1),
        "decode": [] if args.prefill_only else [decode_case(b, c, copy_bps) for b, c in DECODE_SHAPES],
        "prefill_cases": [prefill_case(*case) for case in PREFILL_CASES],
    }
    print_table(results)
    if args.out:
        write_result(args.out, results, "bench.attention_bench", argv)


def print_table(results: dict) -> None:
    print(f"\n{torch.cuda.get_device_name()}  copy {results['copy_GBps']} GB/s (read+write)")
    print("batch context splits | eager us  GB/s  %copy | graph us  GB/s  %copy | torch_ref us | sdpa us")
    for r in results["decode"]:
        e, g = r["eager"], r["graph"]
        print(f"{r['batch']:5d} {r['context']:7d} {r['default_num_splits']:6d} | {e['us']:8.1f} {e['GBps']:6.0f} "
              f"{e['pct_copy']:5.1f} | {g['us']:8.1f} {g['GBps']:6.0f} {g['pct_copy']:5.1f} | "
              f"{r['torch_ref_us']:12.1f} | {r['sdpa_contiguous_us']}")
        best_tile = max(r["tile_sweep"], key=lambda s: s["GBps"])
        best_split = max(r["split_sweep"], key=lambda s: s["GBps"])
        print(f"      best tile {best_tile}\n      best split {best_split}")
    for p in results["prefill_cases"]:
        print(f"prefill {p['rows']}x{p['query_len']} after {p['prefix_len']}: {p['default']} "
              f"sdpa {p.get('sdpa_contiguous')}")
        for s in sorted(p["sweep"], key=lambda s: -s["TFLOPs"])[:4]:
            print("      ", s)


if __name__ == "__main__":
    main()
