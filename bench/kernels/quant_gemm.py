"""Quantized layers at Qwen3-8B's projection shapes beside bf16, as a step runs them: microseconds per product and
the weight bytes read per second as a share of the device-to-device copy bandwidth measured in the same run (the
bytes-read ideal), from 1 to 1024 rows. Each layer is loaded from random checkpoint tensors of its format
(bench/bench_model.py) and runs its own route; FP8 also on each of its two kernels (Triton, cuBLAS), which places the
row count where the route switches. Each figure is the median replay of a CUDA graph of calls rotating over layer
copies, so the weights come from HBM (bench/kernels/timing.py).

    python -m bench.kernels.quant_gemm --out result.json
    python -m bench.kernels.quant_gemm --formats fp8 w4a16 --rows 1 16
"""

import argparse
import sys
from collections.abc import Callable
from types import SimpleNamespace

import torch

from bench.bench_model import QUANTIZATIONS, random_projection
from bench.common import write_result
from bench.kernels.timing import DEVICE, DTYPE, copy_bytes_per_s, num_copies, per_shape, rotated_us_per_call
from gpu.layers.linear import Linear
from gpu.loader import CheckpointTensor, TensorSlice
from gpu.quant import quant_scheme

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}  # (N, K)
ROWS = (1, 2, 4, 8, 16, 64, 256, 1024)
FORMATS = {"bf16": None, "fp8": "fp8", "fp8-triton": "fp8", "fp8-cublas": "fp8", "w4a16": "w4a16",
           "gguf-q4_k": "gguf-q4_k_m", "gguf-q6_k": "gguf-q4_k_m"}  # name -> bench_model's quantization


def build_layer(fmt: str, n: int, k: int, generator: torch.Generator) -> Linear:
    """A CUDA layer [n, k] of `fmt` holding random weights, ready for bf16 activations."""
    with torch.device(DEVICE):
        layer = Linear(k, n, bias=False).to(DTYPE)
    quantization = FORMATS[fmt]
    if quantization is None:
        layer.weight.data.normal_(0, 0.02, generator=generator)
        return layer
    kind = fmt.removeprefix("gguf-").upper()
    settings = {**QUANTIZATIONS[quantization], "tensor_types": {"layer": kind}}
    layer.use_quant_method(quant_scheme(SimpleNamespace(quantization_config=settings)).method_for(  # type: ignore[union-attr,arg-type]
        ["layer"], layer.weight_layout()))
    for name, tensor in random_projection(quantization, kind, n, k, generator).items():
        param = getattr(layer, name)
        param.weight_loader(param, CheckpointTensor(name, TensorSlice(tensor)), None)
    layer.finish_loading(DTYPE)
    return layer


def product(fmt: str) -> Callable[[torch.Tensor, Linear], torch.Tensor]:
    """(x, layer) -> y: the layer's route, or one FP8 kernel."""
    if fmt == "fp8-triton":
        from gpu.kernels.fp8_gemm import fp8_gemm

        return lambda x, layer: fp8_gemm(x, layer.weight, layer.weight_scale_inv, layer.quant.scale_block)
    if fmt == "fp8-cublas":
        return lambda x, layer: layer.quant.cublas_product(layer, x, None, None)
    return lambda x, layer: layer(x)


def time_format(fmt: str, rows: tuple[int, ...], copy_bytes: float) -> list[dict]:
    generator = torch.Generator(device=DEVICE).manual_seed(0)

    def layer_copies(n: int, k: int) -> list[Linear]:
        first = build_layer(fmt, n, k, generator)
        num_bytes = sum(p.numel() * p.element_size() for p in first.parameters())
        return [first] + [build_layer(fmt, n, k, generator) for _ in range(num_copies(num_bytes) - 1)]

    out = []
    for name, n, k, layers in per_shape(SHAPES, layer_copies):
        num_bytes = sum(p.numel() * p.element_size() for p in layers[0].parameters())
        for m in rows:
            x = torch.randn(m, k, dtype=DTYPE, device=DEVICE)
            try:
                us = rotated_us_per_call(product(fmt), x, layers)
            except RuntimeError as error:  # cuBLAS's FP8 block recipe takes no single row
                print(f"{fmt:10s} {name:8s} M={m:5d}  failed: {str(error)[:120]}", flush=True)
                continue
            share = num_bytes / (us * 1e-6) / copy_bytes
            out.append({"format": fmt, "shape": name, "n": n, "k": k, "m": m, "us": round(us, 2),
                        "weight_bytes": num_bytes, "bw_share": round(share, 3)})
            print(f"{fmt:10s} {name:8s} M={m:5d}  {us:8.2f} us  {num_bytes / 2**20:7.1f} MiB  {share:6.1%} of copy "
                  "bandwidth", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.kernels.quant_gemm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    copy_bytes = copy_bytes_per_s()
    rows = [row for fmt in args.formats for row in time_format(fmt, tuple(args.rows), copy_bytes)]
    steps = step_shares(rows, copy_bytes)
    write_result(args.out, {"kind": "quant-gemm", "torch": torch.__version__,
                            "copy_tb_per_s": round(copy_bytes / 1e12, 3), "rows": rows, "steps": steps},
                 "bench.kernels.quant_gemm", argv)


def step_shares(rows: list[dict], copy_bytes_per_s: float) -> list[dict]:
    """Per format and row count, a layer's four products together (a decode step's projections): their weight bytes
    over their time, as a share of the copy bandwidth."""
    out = []
    for fmt, m in sorted({(r["format"], r["m"]) for r in rows}):
        step = [r for r in rows if (r["format"], r["m"]) == (fmt, m)]
        if len(step) == len(SHAPES):
            us = sum(r["us"] for r in step)
            share = sum(r["weight_bytes"] for r in step) / (us * 1e-6) / copy_bytes_per_s
            out.append({"format": fmt, "m": m, "layer_us": round(us, 2), "bw_share": round(share, 3)})
            print(f"{fmt:10s} M={m:5d}  one layer's projections {us:8.2f} us, {share:6.1%} of copy bandwidth")
    return out


if __name__ == "__main__":
    main()
