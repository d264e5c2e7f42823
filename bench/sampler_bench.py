"""Sampler microbenchmark: the torch sampling path against the Triton kernel; run on a CUDA machine.

Decode-step shapes of Qwen3-0.6B: batch 1, 16, 64, 256 rows of vocab 151936, bf16 logits, every
row random at temperature 0.6. Per batch:
- device time of the sampling work alone, as replays of a CUDA graph holding CALLS_PER_GRAPH calls
  (the torch path's device ops: float32 copy, greedy argmax, divide, softmax, exponential noise,
  divide, argmax, where; against `sample_tokens`), and the kernel on greedy rows (no noise: the
  cost of reading the logits) with its rate against the device-to-device copy bandwidth;
- `Sampler.sample` as the engine calls it (host work, copies to the device, kernels), old path
  (`use_fused_kernel` off) against new, timed by `do_bench` (medians; launch-bound at small batches);
- at 256 rows, the routing of top-p rows: 16 or all 256 rows with top_p=0.95 beside plain rows.
A few launch configurations of the kernel are swept (they change the seeded streams, not the
distribution). Prints a table; writes everything as JSON to --out.
"""

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from gpu.batch import RowSampling
from gpu.kernels import sampling
from gpu.kernels.sampling import sample_tokens
from gpu.sampler import Sampler

VOCAB = 151936
TEMPERATURE = 0.6
BATCHES = [1, 16, 64, 256]
CALLS_PER_GRAPH = 10
SWEEP = [  # (SUB, NUM_WARPS, PROGRAMS_PER_SM)
    (1024, 4, 8), (1024, 4, 4), (1024, 4, 16), (1024, 8, 8), (512, 4, 8), (2048, 8, 8),
]


def median_ms(fn: Callable[[], object], rep_ms: int = 100) -> float:
    return float(do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def graph_ms(fn: Callable[[], object]) -> float:
    """Milliseconds per call, replaying a graph of CALLS_PER_GRAPH calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    return median_ms(graph.replay) / CALLS_PER_GRAPH


def torch_path_ops(logits: torch.Tensor, temperatures: torch.Tensor, is_greedy: torch.Tensor) -> torch.Tensor:
    """The device work of the torch path for plain rows (gpu/sampler.py: _torch_token_ids)."""
    logits = logits.float()
    greedy_ids = logits.argmax(dim=-1)
    probs = (logits / temperatures.unsqueeze(1)).softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_()
    return torch.where(is_greedy, greedy_ids, (probs / noise).argmax(dim=-1))


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting bytes read plus written."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_ms(lambda: dst.copy_(src), rep_ms=300) * 1e-3)


def bench_batch(batch: int, bandwidth: float) -> dict:
    logits = (3 * torch.randn(batch, VOCAB, device="cuda")).to(torch.bfloat16)
    temperatures = torch.full((batch,), TEMPERATURE, device="cuda")
    seeds = torch.randint(0, 2**62, (batch,), device="cuda")
    is_greedy = torch.zeros(batch, dtype=torch.bool, device="cuda")
    greedy = torch.zeros_like(temperatures)
    assert torch.equal(sample_tokens(logits, seeds, greedy), logits.argmax(-1))
    rows = [RowSampling(temperature=TEMPERATURE)] * batch
    old, new = Sampler(torch.device("cuda"), 0), Sampler(torch.device("cuda"), 0)
    old.use_fused_kernel = False
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel_greedy_us = graph_ms(lambda: sample_tokens(logits, seeds, greedy)) * 1e3
    result = {
        "batch": batch,
        "torch_ops_graph_us": graph_ms(lambda: torch_path_ops(logits, temperatures, is_greedy)) * 1e3,
        "kernel_graph_us": graph_ms(lambda: sample_tokens(logits, seeds, temperatures)) * 1e3,
        "kernel_greedy_graph_us": kernel_greedy_us,
        "kernel_greedy_pct_copy": 100 * logits.numel() * logits.element_size() / (kernel_greedy_us * 1e-6) / bandwidth,
        "sampler_old_us": median_ms(lambda: old.sample(logits, rows)) * 1e3,
        "sampler_new_us": median_ms(lambda: new.sample(logits, rows)) * 1e3,
        "splits": sampling.choose_num_splits(batch, triton.cdiv(VOCAB, sampling.TILE), num_sms),
    }
    result["sweep_us"] = sweep(logits, seeds, temperatures)
    return result


def sweep(logits: torch.Tensor, seeds: torch.Tensor, temperatures: torch.Tensor) -> dict[str, float]:
    defaults = (sampling.SUB, sampling.NUM_WARPS, sampling.PROGRAMS_PER_SM)
    timings = {}
    for sub, warps, per_sm in SWEEP:
        sampling.SUB, sampling.TILE, sampling.NUM_WARPS, sampling.PROGRAMS_PER_SM = sub, 4 * sub, warps, per_sm
        timings[f"sub{sub}-w{warps}-p{per_sm}"] = graph_ms(lambda: sample_tokens(logits, seeds, temperatures)) * 1e3
    sampling.SUB, sampling.NUM_WARPS, sampling.PROGRAMS_PER_SM = defaults
    sampling.TILE = 4 * sampling.SUB
    return timings


def bench_routing() -> dict[str, float]:
    """256 rows, some with top_p: kernel + torch on those rows (new) vs torch on the whole batch (old)."""
    logits = (3 * torch.randn(256, VOCAB, device="cuda")).to(torch.bfloat16)
    old, new = Sampler(torch.device("cuda"), 0), Sampler(torch.device("cuda"), 0)
    old.use_fused_kernel = False
    timings = {}
    for num_top_p in (16, 256):
        rows = [RowSampling(temperature=TEMPERATURE, top_p=0.95)] * num_top_p
        rows += [RowSampling(temperature=TEMPERATURE)] * (256 - num_top_p)
        for name, sampler in (("old", old), ("new", new)):
            ms = median_ms(lambda s=sampler, r=rows: s.sample(logits, r))
            timings[f"top_p_rows_{num_top_p}_{name}_us"] = ms * 1e3
    return timings


def print_table(results: list[dict], routing: dict[str, float]) -> None:
    print("| batch | splits | torch ops graph us | kernel graph us | speedup | kernel greedy us (% copy) "
          "| Sampler old us | Sampler new us | speedup |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['batch']} | {r['splits']} | {r['torch_ops_graph_us']:.1f} | {r['kernel_graph_us']:.1f} "
              f"| {r['torch_ops_graph_us'] / r['kernel_graph_us']:.1f}x "
              f"| {r['kernel_greedy_graph_us']:.1f} ({r['kernel_greedy_pct_copy']:.0f}%) "
              f"| {r['sampler_old_us']:.1f} | {r['sampler_new_us']:.1f} "
              f"| {r['sampler_old_us'] / r['sampler_new_us']:.1f}x |")
    print("sweep (kernel graph us):")
    for r in results:
        print(f"  batch {r['batch']}: " + ", ".join(f"{k} {v:.1f}" for k, v in r["sweep_us"].items()))
    print("routing at 256 rows:", ", ".join(f"{k} {v:.1f}" for k, v in routing.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    results = [bench_batch(batch, bandwidth) for batch in BATCHES]
    routing = bench_routing()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print_table(results, routing)
    report = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "commit": args.commit,
        "command": "PYTHONPATH=$PWD python3 -m bench.sampler_bench " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vocab": VOCAB,
        "temperature": TEMPERATURE,
        "copy_bandwidth_gbps": bandwidth / 1e9,
        "calls_per_graph": CALLS_PER_GRAPH,
        "results": results,
        "routing_256_rows": routing,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
