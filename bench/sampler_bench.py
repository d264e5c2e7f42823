"""Sampler microbenchmark: the torch sampling path against the Triton kernel; run on a CUDA machine.

Decode-step shapes of Qwen3-0.6B: batch 1, 16, 64, 256 rows of vocab 151936, bf16 logits, every
row random at temperature 0.6. Per batch:
- device time of the sampling work alone, as replays of a CUDA graph holding CALLS_PER_GRAPH calls
  (the torch path's device ops: float32 copy, greedy argmax, divide, softmax, exponential noise,
  divide, argmax, where; against `sample_tokens`), and the kernel on greedy rows (no noise: the
  cost of reading the logits) with its rate against the device-to-device copy bandwidth;
- `Sampler.sample` as the engine calls it (host work, copies to the device, kernels), old path
  (a sampler built with `KernelConfig.fused_sampling` off) against new, timed by `do_bench` (medians;
  launch-bound at small batches);
- at 256 rows, the routing of top-p rows: 16 or all 256 rows with top_p=0.95 beside plain rows.
Prints a table; writes everything as JSON to --out.

    python -m bench.sampler_bench --out result.json
"""

import argparse
import sys

import torch
import triton

from bench.bench_model import QWEN3_0P6B
from bench.common import write_result
from bench.cuda_timing import graph_ms, median_ms
from bench.device_limits import measure_copy_bytes_per_s
from gpu.batch import RowSampling
from gpu.config import KernelConfig
from gpu.kernels import sampling
from gpu.kernels.sampling import sample_tokens
from gpu.sampler import Sampler

VOCAB = int(QWEN3_0P6B["vocab_size"])
TEMPERATURE = 0.6
BATCHES = [1, 16, 64, 256]
CALLS_PER_GRAPH = 10
DEVICE = torch.device("cuda")
TORCH_PATH = KernelConfig(fused_sampling=False)


def torch_path_ops(logits: torch.Tensor, temperatures: torch.Tensor, is_greedy: torch.Tensor) -> torch.Tensor:
    """The device work of the torch path for plain rows (gpu/sampler.py: _torch_token_ids)."""
    logits = logits.float()
    greedy_ids = logits.argmax(dim=-1)
    probs = (logits / temperatures.unsqueeze(1)).softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_()
    return torch.where(is_greedy, greedy_ids, (probs / noise).argmax(dim=-1))


def bench_batch(batch: int, bandwidth: float) -> dict:
    logits = (3 * torch.randn(batch, VOCAB, device="cuda")).to(torch.bfloat16)
    temperatures = torch.full((batch,), TEMPERATURE, device="cuda")
    seeds = torch.randint(0, 2**62, (batch,), device="cuda")
    is_greedy = torch.zeros(batch, dtype=torch.bool, device="cuda")
    greedy = torch.zeros_like(temperatures)
    assert torch.equal(sample_tokens(logits, seeds, greedy), logits.argmax(-1))
    rows = [RowSampling(temperature=TEMPERATURE)] * batch
    old, new = Sampler(DEVICE, 0, TORCH_PATH), Sampler(DEVICE, 0)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel_greedy_us = graph_ms(lambda: sample_tokens(logits, seeds, greedy), CALLS_PER_GRAPH) * 1e3
    return {
        "batch": batch,
        "torch_ops_graph_us": graph_ms(lambda: torch_path_ops(logits, temperatures, is_greedy), CALLS_PER_GRAPH) * 1e3,
        "kernel_graph_us": graph_ms(lambda: sample_tokens(logits, seeds, temperatures), CALLS_PER_GRAPH) * 1e3,
        "kernel_greedy_graph_us": kernel_greedy_us,
        "kernel_greedy_pct_copy": 100 * logits.numel() * logits.element_size() / (kernel_greedy_us * 1e-6) / bandwidth,
        "sampler_old_us": median_ms(lambda: old.sample(logits, rows), rep_ms=100) * 1e3,
        "sampler_new_us": median_ms(lambda: new.sample(logits, rows), rep_ms=100) * 1e3,
        "splits": sampling.choose_num_splits(batch, triton.cdiv(VOCAB, sampling.TILE), num_sms),
    }


def bench_routing() -> dict[str, float]:
    """256 rows, some with top_p: kernel + torch on those rows (new) vs torch on the whole batch (old)."""
    logits = (3 * torch.randn(256, VOCAB, device="cuda")).to(torch.bfloat16)
    old, new = Sampler(DEVICE, 0, TORCH_PATH), Sampler(DEVICE, 0)
    timings = {}
    for num_top_p in (16, 256):
        rows = [RowSampling(temperature=TEMPERATURE, top_p=0.95)] * num_top_p
        rows += [RowSampling(temperature=TEMPERATURE)] * (256 - num_top_p)
        for name, sampler in (("old", old), ("new", new)):
            ms = median_ms(lambda s=sampler, r=rows: s.sample(logits, r), rep_ms=100)
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
    print("routing at 256 rows:", ", ".join(f"{k} {v:.1f}" for k, v in routing.items()))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.sampler_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    bandwidth = measure_copy_bytes_per_s(DEVICE, 2 << 30)
    results = [bench_batch(batch, bandwidth) for batch in BATCHES]
    routing = bench_routing()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print_table(results, routing)
    if args.out:
        write_result(args.out, {
            "kind": "sampler", "torch": torch.__version__, "triton": triton.__version__, "vocab": VOCAB,
            "temperature": TEMPERATURE, "copy_bandwidth_gbps": bandwidth / 1e9, "calls_per_graph": CALLS_PER_GRAPH,
            "results": results, "routing_256_rows": routing}, "bench.sampler_bench", argv)


if __name__ == "__main__":
    main()
