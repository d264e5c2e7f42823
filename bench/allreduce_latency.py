"""What tensor parallelism's collectives cost: NCCL all-reduce time per call on this host's GPUs.

A decode step of a tensor-parallel model makes two all-reduces of [rows, hidden] per layer (80 for
Qwen3-14B's 40 layers), which the roofline (bench/roofline.py) does not count. This measures one
all-reduce's time at the sizes a step uses, eagerly and replayed inside a CUDA graph (as the decode
graphs run them): a graph of `--calls` all-reduces, replayed, timed with CUDA events, per call.

    python -m bench.allreduce_latency --ranks 2 --hidden 5120 --out bench/results/allreduce.json
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.common import write_result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.allreduce_latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--rows", default="1,8,64,256", help="batch rows to measure (comma-separated)")
    p.add_argument("--calls", type=int, default=80, help="all-reduces per timed graph (a step of 40 layers)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _time_ms(fn: object, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()  # type: ignore[operator]
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def _run(rank: int, args: argparse.Namespace, port: int, out_path: str) -> None:
    """One rank (spawned): measures every size; rank 0 writes the figures to out_path."""
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks,
                            device_id=device)
    rows_list = [int(r) for r in args.rows.split(",")]
    figures = []
    for rows in rows_list:
        x = torch.zeros(rows, args.hidden, dtype=torch.bfloat16, device=device)  # sums stay finite

        def calls(x: torch.Tensor = x) -> None:
            for _ in range(args.calls):
                dist.all_reduce(x)

        calls()  # warm-up (and the communicator's first use) outside the graph
        torch.cuda.synchronize()
        eager_ms = _time_ms(calls, args.repeats)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            calls()
        torch.cuda.synchronize()
        graph_ms = _time_ms(graph.replay, args.repeats)
        figures.append({"rows": rows, "bytes": rows * args.hidden * 2,
                        "eager_us_per_call": round(eager_ms * 1e3 / args.calls, 2),
                        "graph_us_per_call": round(graph_ms * 1e3 / args.calls, 2)})
    if rank == 0:
        Path(out_path).write_text(json.dumps(figures))
    dist.barrier()
    torch.cuda.synchronize()
    # Not destroy_process_group: after NCCL calls captured in a CUDA graph it held the ranks past the stage's
    # 60 s on 2x H200 (as it held gpu/tensor_parallel_worker.py's); the process's end frees the communicator.
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "figures.json")
        mp.spawn(_run, args=(args, port, path), nprocs=args.ranks, join=True)
        figures = json.loads(Path(path).read_text())
    result = {"kind": "allreduce_latency", "ranks": args.ranks, "hidden": args.hidden, "calls_per_graph": args.calls,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "figures": figures}
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        write_result(args.out, result, "bench.allreduce_latency", argv)


if __name__ == "__main__":
    main()
