"""Packs a loaded model's linear weights for the CPU (gpu/layers/cpu_linear.py), once, before it serves.

Which kernels multiply them (`cpu_packing`): the integer dot-product kernels of gpu/cpu_kernels/int8_dot.c where
they built for this CPU (float32 or bfloat16 activations); else, in bfloat16, torch's int4 kernel; else nothing is
packed. Every `Linear` (the projections, tensor-parallel ones included) and the
LM head are packed in place; the projections free their weight, the LM head keeps it (a tied embedding reads it).
"""

import re
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from gpu.cpu_kernels import CpuKernels
from gpu.layers.cpu_linear import CpuPacking, int4_grid, int8_grid
from gpu.layers.linear import Linear
from gpu.layers.vocab_parallel import ParallelLMHead
from gpu.loader import iter_checkpoint

FIRST_LAYER_PROJECTION = re.compile(r"(^|\.)layers\.0\..*_proj\.weight$")


def has_native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX) and torch has oneDNN."""
    checks = (getattr(torch.cpu, name, bool) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check() for check in checks) and torch.backends.mkldnn.is_available()


def cpu_packing(dtype: torch.dtype, kernels: CpuKernels, is_reference: bool = False) -> tuple[CpuPacking | None, str]:
    """How a CPU runner in `dtype` packs its weights (None: it does not), and which kernels, for the log.
    `is_reference`: float32 asked for by name, the parity reference: weights as loaded and activations in float32, so
    nothing is packed (the int8 dot products quantize activations; `--dtype auto` takes them)."""
    if is_reference:
        return None, "none: float32 asked for by name is the reference (the weights as loaded, float32 activations)"
    if kernels.int8_dot is not None:
        return CpuPacking(dtype, kernels.int8_dot), f"int8 dot products ({kernels.int8_dot.ISA})"
    if dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
        return CpuPacking(dtype, None), "torch's int4 kernel (the int8 dot-product kernels are not built)"
    return None, "none: the int8 dot-product kernels are not built, and torch's int4 kernel takes bfloat16 only"


def pack_linear_layers(model: nn.Module, packing: CpuPacking) -> Counter[str]:
    """Packs every linear weight of `model`; returns how many layers took each packed form (or stayed as loaded)."""
    kinds: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, Linear):
            kinds[module.pack_for_cpu(packing) or "as loaded"] += 1
        elif isinstance(module, ParallelLMHead):
            kinds[f"{module.pack_for_cpu(packing) or 'as loaded'} (LM head)"] += 1
    return kinds


def first_layer_on_a_grid(model_dir: Path) -> bool:
    """Whether every projection of the checkpoint's first decoder layer lies on a grid the int8 dot products take
    (a Q4_0, Q4_1, Q4_K, Q5_0, Q6_K or Q8_0 GGUF's do; unquantized weights do not), read from the files before the
    model is built. The first layer stands for the rest, so that the check reads a layer's bytes, not the model's: a
    file quantized otherwise past its first layer would run those layers' float32 weights unpacked. False without such
    a layer or files."""
    found = False
    try:
        for tensor in iter_checkpoint(model_dir):
            if len(tensor.shape) != 2 or not FIRST_LAYER_PROJECTION.search(tensor.name):
                continue
            weight = tensor.read().float()
            if int4_grid(weight) is None and int8_grid(weight) is None:
                return False
            found = True
    except FileNotFoundError:
        return False
    return found
