"""Integer weights with a float scale (and zero point) per group of input columns: the one stored form of AWQ, GPTQ
and compressed-tensors' `pack-quantized` checkpoints (W4A16, W8A16), which each format's module converts its own
tensors into after loading.

Stored form, on the layer:
- `int_weight` int32 [out, in * bits / 32]: each row's unsigned levels (0 .. 2^bits - 1) packed along the input
  columns, column k at bits (k % per_word) * bits of word k // per_word (per_word = 32 / bits);
- `int_scales` [out, num_groups] in the checkpoint's float dtype;
- `int_zeros` [out, num_groups] in the same dtype (small integers, exact), absent where the format is symmetric
  (the zero point is then 2^(bits - 1));
- `int_group_ids` int32 [in], present where the checkpoint orders its groups by activation (GPTQ's `desc_act`,
  compressed-tensors' `actorder: group`): column k's group; otherwise column k's group is k // group_size.
The weight is w[n, k] = (level[n, k] - zero[n, g]) * scale[n, g] with g column k's group.

On a GPU the product dequantizes inside the GEMM's main loop (gpu/kernels/int_gemm.py), so a decode step reads the
packed bytes; on a CPU the dequantized weight runs.
"""

from dataclasses import dataclass

import torch
from torch import nn

from gpu.quant.layout import WeightLayout
from gpu.quant.method import QuantMethod

STORED_NAMES = ("int_weight", "int_scales", "int_zeros", "int_group_ids")


@dataclass
class IntGroups:
    """The stored form's tensors (see the module's docstring)."""

    bits: int
    levels: torch.Tensor  # [out, in] int32, unsigned levels (unpacked: `pack_columns` packs them)
    scales: torch.Tensor  # [out, num_groups]
    zeros: torch.Tensor | None  # [out, num_groups], or None: 2^(bits - 1)
    group_ids: torch.Tensor | None  # [in] int32, or None: k // group_size

    def dequantize(self) -> torch.Tensor:
        group_size = self.levels.shape[1] // self.scales.shape[1]
        groups = (self.group_ids.long() if self.group_ids is not None
                  else torch.arange(self.levels.shape[1], device=self.levels.device) // group_size)
        scales = self.scales.float()[:, groups]
        zeros = self.zeros.float()[:, groups] if self.zeros is not None else float(1 << (self.bits - 1))
        return (self.levels.float() - zeros) * scales


def pack_columns(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, cols] levels in 0 .. 2^bits - 1 -> [rows, cols * bits / 32] int32, sequentially from the low bits."""
    per_word = 32 // bits
    rows, cols = levels.shape
    if cols % per_word:
        raise ValueError(f"{cols} columns do not pack into whole words of {per_word} {bits}-bit levels")
    shifts = torch.arange(per_word, device=levels.device, dtype=torch.int64) * bits
    words = (levels.to(torch.int64).view(rows, cols // per_word, per_word) << shifts).sum(-1)
    return _as_int32(words)


def unpack_columns(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `pack_columns`: [rows, words] int32 -> [rows, words * 32 / bits] int32 levels."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int32) * bits
    levels = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return levels.reshape(words.shape[0], -1)


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in 0 .. 2^32 - 1 as the int32 with the same bits."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


class IntGroupsMethod(QuantMethod):
    """The method of a format stored as `IntGroups`: its module says how its checkpoint tensors load (create_params,
    tensor_layout) and how they become the stored form (`int_groups`)."""

    def __init__(self, layout: WeightLayout, bits: int, group_size: int | None) -> None:
        """group_size: columns per group of the checkpoint; None: one group per row (per-channel scales)."""
        super().__init__(layout)
        if bits not in (4, 8):
            raise ValueError(f"{self.format_name}: {bits}-bit weights are not supported (4 or 8)")
        self.bits = bits
        self.group_size = group_size

    def int_groups(self, layer: nn.Module) -> IntGroups:
        """The loaded checkpoint tensors as the stored form."""
        raise NotImplementedError

    def finish_loading(self, layer: nn.Module) -> None:
        groups = self.int_groups(layer)
        for name in [n for n in layer._parameters if n != "bias"]:
            delattr(layer, name)
        stored = {"int_weight": pack_columns(groups.levels, self.bits), "int_scales": groups.scales.contiguous(),
                  "int_zeros": groups.zeros, "int_group_ids": groups.group_ids}
        for name, tensor in stored.items():
            if tensor is not None:
                layer.register_parameter(name, nn.Parameter(tensor.contiguous(), requires_grad=False))

    def stored(self, layer: nn.Module) -> IntGroups:
        weight = layer.int_weight
        return IntGroups(self.bits, unpack_columns(weight, self.bits), layer.int_scales,
                         getattr(layer, "int_zeros", None), getattr(layer, "int_group_ids", None))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from gpu.kernels.int_gemm import int_gemm

        rows = x.reshape(-1, x.shape[-1])
        y = int_gemm(rows, layer.int_weight, layer.int_scales, getattr(layer, "int_zeros", None),
                     getattr(layer, "int_group_ids", None), self.bits, bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return self.stored(layer).dequantize()

    def local_group_size(self) -> int:
        return self.group_size or self.layout.in_features
