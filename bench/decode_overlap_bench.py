"""Whether two halves of a decode batch, run on two CUDA streams at once, beat the whole batch on one.

A full decode step is mostly the attention kernel reading K/V at copy bandwidth; the GEMMs, norms and
the rest are short kernels bound by latency, not by bandwidth. Run as two independent half batches on
two streams, one half's short kernels could fill the gaps and the idle SMs beside the other half's
attention. This measures it before anything is built for it: CUDA-graph replays of the model's forward
pass (no logits, no sampling) over the same rows

- `whole`: one graph of the batch on one stream (what the engine runs today),
- `halves_in_turn`: the two halves one after the other on one stream,
- `halves_overlapped`: the two halves forked onto two streams inside one graph, and
- `halves_overlapped_prio`: the same with the second stream at a higher priority,

and the largest difference between the whole batch's hidden states and the halves' (a check that the
halves computed the same rows). Device milliseconds per replay, the median of several rounds.

On an H100 the overlap never won (0.89-0.98x of the whole batch; bench/results/notes.md, issue 14's
fourth session), so nothing was built on it.

    python -m bench.decode_overlap_bench --batches 128,256 --contexts 512,1024 --out result.json
"""

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace

import torch

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.common import write_result
from bench.decode_step_bench import BLOCK, decode_batch
from core.config import engine_config
from core.engine import runner_config
from gpu.batch import Batch
from gpu.cuda_graphs import DecodeGraphs
from gpu.model_runner import ModelRunner


def half_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Rows start..stop of a decode-only batch."""
    return replace(
        batch, token_ids=batch.token_ids[start:stop], positions=batch.positions[start:stop],
        slot_mapping=batch.slot_mapping[start:stop], query_lens=batch.query_lens[start:stop],
        context_lens=batch.context_lens[start:stop], block_tables=batch.block_tables[start:stop],
        sampling=batch.sampling[start:stop])


def capture(body: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    body()  # warm-up: compiles, settles allocations
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()
    torch.cuda.synchronize()
    return graph, out


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


@torch.inference_mode()
def measure(runner: ModelRunner, batch_size: int, context: int, replays: int, rounds: int) -> dict[str, object]:
    model, c, device = runner.model, runner.config, runner.device
    batch = decode_batch(batch_size, context)
    half = batch_size // 2
    sets = {name: DecodeGraphs(model, rows, c.max_model_len, c.block_size, device)
            for name, rows in (("whole", batch_size), ("a", half), ("b", batch_size - half))}
    for name, rows in (("whole", batch), ("a", half_batch(batch, 0, half)),
                       ("b", half_batch(batch, half, batch_size))):
        sets[name].run(rows, None)  # fills the static buffers (no graph captured there: runs eagerly once)
    args = {name: graphs._static_args(graphs.buckets[-1]) for name, graphs in sets.items()}
    side = torch.cuda.Stream()
    side_prio = torch.cuda.Stream(priority=-5)  # clamped to the highest priority the device has

    def whole() -> torch.Tensor:
        return model(*args["whole"])

    def in_turn() -> torch.Tensor:
        return torch.cat([model(*args["a"]), model(*args["b"])])

    def overlapped(stream: torch.cuda.Stream) -> Callable[[], torch.Tensor]:
        def body() -> torch.Tensor:
            main = torch.cuda.current_stream()
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                out_b = model(*args["b"])
            out_a = model(*args["a"])
            main.wait_stream(stream)
            return torch.cat([out_a, out_b])
        return body

    variants = {"whole": whole, "halves_in_turn": in_turn, "halves_overlapped": overlapped(side),
                "halves_overlapped_prio": overlapped(side_prio)}
    graphs = {name: capture(body) for name, body in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):  # interleaved, so a clock or thermal drift hits every variant alike
        for name, (graph, _) in graphs.items():
            graph.replay()
            times[name].append(replay_ms(graph, replays))
    reference = graphs["whole"][1]
    row: dict[str, object] = {"batch": batch_size, "context": context}
    for name, (_, out) in graphs.items():
        row[f"{name}_ms"] = round(statistics.median(times[name]), 4)
        row[f"{name}_max_abs_diff"] = float((out - reference).abs().max())  # type: ignore[operator]
    row["overlap_speedup"] = round(row["whole_ms"] / min(row["halves_overlapped_ms"],  # type: ignore[operator]
                                                         row["halves_overlapped_prio_ms"]), 4)
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.decode_overlap_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=DEFAULT_DIR)
    p.add_argument("--batches", default="128,256")
    p.add_argument("--contexts", default="512,1024")
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    max_rows, blocks_per_row = max(batches), -(-max(contexts) // BLOCK)
    config = runner_config(engine_config(
        str(build_bench_model(args.model_dir)), dtype="bfloat16", device="cuda", block_size=BLOCK,
        kv_cache_blocks=max_rows * blocks_per_row + 16, max_num_seqs=max_rows, max_model_len=4096,
        attention_backend="triton"))
    runner = ModelRunner(config)
    for layer in runner.layers:  # random K/V: timing on zeros can flatter a kernel
        layer.k_cache.normal_()
        layer.v_cache.normal_()
    rows = [measure(runner, b, ctx, args.replays, args.rounds) for b in batches for ctx in contexts]
    if args.out:
        write_result(args.out, {"kind": "decode-overlap", "torch": torch.__version__, "rows": rows},
                     "bench.decode_overlap_bench", argv)


if __name__ == "__main__":
    main()
