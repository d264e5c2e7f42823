"""The host cost of sending a step's batch to tensor-parallel workers (gpu/batch_wire.py), per step.

Engine side: packing the inputs and pickling the two messages (rank 0's with the sampling rows, the
others' without). Worker side: unpickling one. Beside them, what a runner in one process spends on the same
conversions (block tables and the per-token lists to arrays), which the packed form spares the workers.
Shapes: a decode step of 256 rows at a 1k-token context (64 blocks of 16 per row), and a prefill of
8192 tokens in 8 rows. Best of `--repeats` (the least disturbed by other load on the host).

    python -m bench.batch_wire_cost --out bench/results/batch_wire_cost.json
"""

import argparse
import random
import sys
import time
from collections.abc import Callable

import numpy as np

from bench.common import write_result
from gpu.batch import Batch, RowSampling
from gpu.batch_wire import decode, encode
from gpu.host_to_device import write_block_tables


def decode_batch(rows: int, blocks_per_row: int, rng: random.Random) -> Batch:
    return Batch(
        token_ids=[rng.randrange(150_000) for _ in range(rows)], positions=[rng.randrange(4096) for _ in range(rows)],
        slot_mapping=[rng.randrange(10**6) for _ in range(rows)], query_lens=[1] * rows,
        context_lens=[1024] * rows, block_tables=[[rng.randrange(60_000) for _ in range(blocks_per_row)]
                                                  for _ in range(rows)],
        sampling=[RowSampling(temperature=0.6, output_index=i) for i in range(rows)],
        fed_back_token_indices=list(range(rows)), fed_back_rows=list(range(rows)))


def prefill_batch(num_tokens: int, rows: int, rng: random.Random) -> Batch:
    per_row = num_tokens // rows
    return Batch(
        token_ids=[rng.randrange(150_000) for _ in range(num_tokens)],
        positions=[p for _ in range(rows) for p in range(per_row)],
        slot_mapping=list(range(num_tokens)), query_lens=[per_row] * rows, context_lens=[per_row] * rows,
        block_tables=[list(range(r * per_row // 16, (r + 1) * per_row // 16)) for r in range(rows)],
        sampling=[RowSampling(temperature=0.6)] * rows)


def best_us(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return round(best * 1e6, 1)


def costs(batch: Batch, repeats: int) -> dict[str, float]:
    first, other = encode(batch)
    table = np.zeros((batch.num_rows, max(map(len, batch.block_tables))), dtype=np.int32)  # type: ignore[arg-type]

    def one_process() -> None:
        write_block_tables(table, batch.block_tables)
        for values in (batch.token_ids, batch.positions, batch.slot_mapping):
            np.asarray(values, dtype=np.int64)

    return {"engine_encode_us": best_us(lambda: encode(batch), repeats),
            "rank0_decode_us": best_us(lambda: decode(first), repeats),
            "other_rank_decode_us": best_us(lambda: decode(other), repeats),
            "rank0_message_bytes": len(first), "other_rank_message_bytes": len(other),
            "one_process_runner_conversions_us": best_us(one_process, repeats)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.batch_wire_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rng = random.Random(0)
    result = {"kind": "batch_wire_cost", "decode_256_rows_1k_context": costs(decode_batch(256, 64, rng), args.repeats),
              "prefill_8192_tokens": costs(prefill_batch(8192, 8, rng), args.repeats)}
    print(result, flush=True)
    if args.out:
        write_result(args.out, result, "bench.batch_wire_cost", argv)


if __name__ == "__main__":
    main()
