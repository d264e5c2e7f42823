"""Decode attention when the rows' contexts differ, as they do in a served batch; CUDA only.

The attention microbenchmark (bench/attention_bench.py) gives every row the same context. In a
real batch the contexts spread (the offline workload's rows run from ~100 to ~2k tokens), and with
one program per (row, KV head) the step ends when the last long program does. This times the decode
kernel on such batches with the rows launched in their given (random) order, longest first, and
shortest first, and reports the K/V bandwidth as a share of the device's copy bandwidth.

    python -m bench.attention_mixed --out bench/results/attention-mixed-h100.json
"""

import argparse
import json
import sys

import torch

from bench.attention_bench import BLOCK_SIZE, DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, SCALE
from bench.common import write_result
from bench.cuda_timing import median_ms
from bench.device_limits import measure_copy_bytes_per_s
from gpu.kernels.decode_attention import decode_attention

# (rows, shortest context, longest context): contexts uniform in between, one fixed seed.
CASES = [(256, 100, 2048), (256, 500, 700), (128, 100, 2048), (64, 100, 2048), (256, 400, 4096), (32, 100, 2048)]


def time_case(num_rows: int, shortest: int, longest: int, generator: torch.Generator) -> dict[str, object]:
    contexts = torch.randint(shortest, longest + 1, (num_rows,), generator=generator)
    blocks_per_row = -(-contexts // BLOCK_SIZE)
    num_blocks = int(blocks_per_row.sum())
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
    v_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
    shuffled = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    table = torch.zeros(num_rows, int(blocks_per_row.max()), dtype=torch.int32)
    start = 0
    for row, n in enumerate(blocks_per_row.tolist()):
        table[row, :n] = shuffled[start : start + n]
        start += n
    query = torch.randn(num_rows, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    context_lens = contexts.to(torch.int32).cuda()
    table = table.cuda()
    orders = {
        "given": None,
        "longest_first": torch.argsort(contexts, descending=True).to(torch.int32).cuda(),
        "shortest_first": torch.argsort(contexts).to(torch.int32).cuda(),
    }
    kv_bytes = int(contexts.sum()) * NUM_KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize
    reference = decode_attention(query, k_cache, v_cache, table, context_lens, SCALE)
    result: dict[str, object] = {"rows": num_rows, "contexts": [shortest, longest],
                                 "mean_context": round(float(contexts.float().mean()), 1), "kv_bytes": kv_bytes}
    for name, order in orders.items():
        out = decode_attention(query, k_cache, v_cache, table, context_lens, SCALE, row_order=order)
        assert torch.equal(out, reference), f"row order {name} changed the output"
        ms = median_ms(lambda order=order: decode_attention(query, k_cache, v_cache, table, context_lens, SCALE,
                                                            row_order=order), rep_ms=300)
        result[name] = {"us": round(ms * 1e3, 2), "GBps": round(kv_bytes / (ms * 1e-3) / 1e9, 1)}
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.attention_mixed", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    copy_bps = measure_copy_bytes_per_s(torch.device("cuda"), 2 << 30)
    generator = torch.Generator().manual_seed(0)
    cases = []
    for case in CASES:
        r = time_case(*case, generator)
        for name in ("given", "longest_first", "shortest_first"):
            r[name]["pct_copy"] = round(100 * r[name]["GBps"] * 1e9 / copy_bps, 1)  # type: ignore[index]
        print(json.dumps(r), flush=True)
        cases.append(r)
        torch.cuda.empty_cache()
    result = {"kind": "attention-mixed", "torch": torch.__version__, "copy_GBps": round(copy_bps / 1e9, 1),
              "heads": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                        "block_size": BLOCK_SIZE}, "cases": cases}
    if args.out:
        write_result(args.out, result, "bench.attention_mixed", argv)


if __name__ == "__main__":
    main()
