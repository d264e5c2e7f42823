"""Packs a loaded model's linear weights for the CPU (gpu/layers/cpu_linear.py), once, before it serves.

Runs on a CPU in bfloat16 only: the packed forms take bfloat16 activations, and float32 runs are the
parity reference. Every `Linear` (the projections, tensor-parallel ones included) and the LM head are
packed in place; the projections free their weight, the LM head keeps it (a tied embedding reads it).
"""

from collections import Counter

import torch
from torch import nn

from gpu.layers.linear import Linear
from gpu.layers.vocab_parallel import ParallelLMHead


def has_native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX) and torch has oneDNN."""
    checks = (getattr(torch.cpu, name, bool) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check() for check in checks) and torch.backends.mkldnn.is_available()


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def pack_linear_layers(model: nn.Module) -> Counter[str]:
    """Packs every linear weight of `model`; returns how many layers took each packed form."""
    kinds: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, Linear):
            kinds[module.pack_for_cpu()] += 1
        elif isinstance(module, ParallelLMHead):
            kinds[f"{module.pack_for_cpu()} (LM head)"] += 1
    return kinds
