"""Integer weights with a float scale (and zero point or offset) per group of input columns: what AWQ, GPTQ,
compressed-tensors' `pack-quantized` (W4A16, W8A16) and GGUF's block types all are once unpacked, and the one form
the GPU kernel reads them in.

`IntGroups` is the unpacked rule: w[n, k] = (level[n, k] - zero[n, g]) * scale[n, g] + offset[n, g], g column k's
group (its group id, or k // group_size), the zero a constant where the format has none per group, the offset 0 where
it has none. Each format's module turns its checkpoint tensors into one (`int_groups`).

`IntWeight` is the kernel's form, made once after loading (`to_kernel_form`):
- `weight` int32 [out, in * bits / 32]: levels packed along the columns in pairs, each pair of consecutive columns in
  the two 16-bit halves of a word (column per_word * w + 2j + h at bit bits * j + 16 * h of word w), so the kernel
  turns a word into pairs of 16-bit floats with a mask, as the tensor cores take them;
- `scales`, and `zeros` or `offsets` where the format has them, [out, groups] in the activation dtype (zero points
  equal for every group, as symmetric GPTQ checkpoints store them, become the constant `zero`);
- groups of `group` columns, a power of two: where a checkpoint orders its columns' groups by activation (GPTQ's
  desc_act, compressed-tensors' actorder) the columns are sorted by group, and `perm` [in] (int32) says which column
  of x each stored column multiplies; groups of uneven size split into smaller ones with their group's scale.
`IntWeight.int_groups()` unpacks it back: the reference every kernel and the CPU path are checked against.
"""

from dataclasses import dataclass

import torch
from torch import nn

from gpu.quant.layout import WeightLayout
from gpu.quant.method import QuantMethod


@dataclass
class IntGroups:
    bits: int
    levels: torch.Tensor  # [out, in] int32, unsigned levels 0 .. 2^bits - 1
    scales: torch.Tensor  # [out, groups]
    zeros: torch.Tensor | None = None  # [out, groups], or None: `zero` for every group
    group_ids: torch.Tensor | None = None  # [in] int32, or None: column k's group is k // group_size
    zero: float | None = None  # the constant zero point (None: 2^(bits - 1))
    offsets: torch.Tensor | None = None  # [out, groups], added after scaling

    @property
    def constant_zero(self) -> float:
        return float(1 << (self.bits - 1)) if self.zero is None else self.zero

    def column_groups(self) -> torch.Tensor:
        """[in] int64: each column's group."""
        if self.group_ids is not None:
            return self.group_ids.long()
        columns = self.levels.shape[1]
        return torch.arange(columns, device=self.levels.device) // -(-columns // self.scales.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The weight [out, in] in float32."""
        groups = self.column_groups()
        zeros = self.zeros.float()[:, groups] if self.zeros is not None else self.constant_zero
        weight = (self.levels.float() - zeros) * self.scales.float()[:, groups]
        return weight if self.offsets is None else weight + self.offsets.float()[:, groups]


@dataclass
class IntWeight:
    """The kernel's form of an `IntGroups` (see the module's docstring); tensors on the layer's device."""

    bits: int
    group: int
    zero: float
    weight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    perm: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"weight": self.weight, "scales": self.scales, "zeros": self.zeros, "offsets": self.offsets,
                 "perm": self.perm}
        return {name: t for name, t in named.items() if t is not None}

    def int_groups(self) -> IntGroups:
        """The rule this form stores, in the checkpoint's column order."""
        levels = unpack_pairs(self.weight, self.bits)
        columns = levels.shape[1]
        group_ids = torch.arange(columns, device=levels.device) // self.group
        if self.perm is not None:
            order = self.perm.long()
            unsorted = torch.empty_like(levels)
            unsorted[:, order] = levels
            levels, ids = unsorted, torch.empty_like(group_ids)
            ids[order] = group_ids
            group_ids = ids
        return IntGroups(self.bits, levels, self.scales, self.zeros, group_ids.to(torch.int32), self.zero,
                         self.offsets)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] @ W.T (+ bias) on the GPU kernel."""
        from gpu.kernels.int_gemm import int_gemm

        return int_gemm(x, self, bias, out=out)


def to_kernel_form(groups: IntGroups, dtype: torch.dtype) -> IntWeight:
    """`groups` in the kernel's form, its per-group values in `dtype` (the activations')."""
    column_groups = groups.column_groups()
    columns = column_groups.shape[0]
    perm = None
    if bool((column_groups[1:] < column_groups[:-1]).any()):
        perm = torch.argsort(column_groups, stable=True)
        column_groups = column_groups[perm]
    size = _even_group_size(column_groups)
    first_ids = column_groups[::size]  # each stored group's group in the checkpoint

    def per_group(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[:, first_ids].to(dtype).contiguous()

    levels = groups.levels if perm is None else groups.levels[:, perm]
    zeros, zero = groups.zeros, groups.constant_zero
    if zeros is not None and bool((zeros == zeros.flatten()[0]).all()):  # symmetric GPTQ: one zero for every group
        zeros, zero = None, float(zeros.flatten()[0])
    return IntWeight(groups.bits, size if size < columns else _power_of_two_at_least(columns), zero,
                     pack_pairs(levels, groups.bits), per_group(groups.scales), per_group(zeros),  # type: ignore[arg-type]
                     per_group(groups.offsets), None if perm is None else perm.to(torch.int32).contiguous())


def _even_group_size(column_groups: torch.Tensor) -> int:
    """The largest power of two that every run of one group starts on: groups of that many columns each have one
    scale (a checkpoint's groups, or parts of them)."""
    columns = column_groups.shape[0]
    starts = [0, *((column_groups[1:] != column_groups[:-1]).nonzero().flatten() + 1).tolist()]
    size = _power_of_two_at_least(columns)
    while any(start % size for start in starts):
        size //= 2
    return size


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def pack_pairs(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, cols] levels in 0 .. 2^bits - 1 -> [rows, cols * bits / 32] int32 in pairs (the module's docstring)."""
    per_word = 32 // bits
    rows, cols = levels.shape
    if cols % per_word:
        raise ValueError(f"{cols} columns do not pack into whole words of {per_word} {bits}-bit levels")
    shifts = _pair_shifts(bits, levels.device)
    words = (levels.to(torch.int64).view(rows, cols // per_word, per_word // 2, 2) << shifts).sum((-1, -2))
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack_pairs(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `pack_pairs`: [rows, words] int32 -> [rows, words * 32 / bits] int32 levels."""
    levels = (words.to(torch.int64)[:, :, None, None] >> _pair_shifts(bits, words.device)) & ((1 << bits) - 1)
    return levels.reshape(words.shape[0], -1).to(torch.int32)


def _pair_shifts(bits: int, device: torch.device) -> torch.Tensor:
    """[pairs per word, 2]: the bit of column 2j + h of a word."""
    pairs = 16 // bits
    return (torch.arange(pairs, device=device)[:, None] * bits + torch.tensor([0, 16], device=device)).to(torch.int64)


def unpack_columns(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Checkpoints' sequential packing: [rows, words] int32, column k at bits (k % per_word) * bits of word
    k // per_word -> [rows, words * 32 / bits] int32 levels."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int32) * bits
    levels = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return levels.reshape(words.shape[0], -1)


STORED = ("int_weight", "int_scales", "int_zeros", "int_offsets", "int_perm")


class IntGroupsMethod(QuantMethod):
    """The method of a format stored as `IntWeight`: its module says how its checkpoint tensors load (create_params,
    tensor_layout) and how they become `IntGroups` (`int_groups`)."""

    def __init__(self, layout: WeightLayout, bits: int, group_size: int | None, has_act_order: bool = False,
                 has_zero_points: bool = True) -> None:
        """group_size: columns per group of the checkpoint; None: one group per row (per-channel scales).
        has_act_order: the checkpoint names each column's group (by activation order). has_zero_points: a zero
        point per group (asymmetric), else 2^(bits - 1)."""
        super().__init__(layout)
        if bits not in (4, 8):
            raise ValueError(f"{self.format_name}: {bits}-bit weights are not supported (4 or 8)")
        self.bits = bits
        self.group_size = group_size
        self.has_act_order = has_act_order
        self.has_zero_points = has_zero_points
        self.stored: IntWeight | None = None

    def packed_sizes(self) -> tuple[int, int, int, int]:
        """(out features, in features, levels per int32, rows of the per-group tensors) of this layer."""
        return self.layout.out_features, self.layout.in_features, 32 // self.bits, self.num_groups()

    def num_groups(self) -> int:
        """This layer's rows of the per-group tensors: its columns' groups, or every group where columns pick theirs
        by activation order (a rank's share of the columns may then use any of them)."""
        if self.group_size is None:
            return 1
        columns = self.layout.columns.total if self.has_act_order else self.layout.in_features
        return -(-columns // self.group_size)

    def int_groups(self, layer: nn.Module) -> IntGroups:
        """The loaded checkpoint tensors as the rule."""
        raise NotImplementedError

    def finish_loading(self, layer: nn.Module, dtype: torch.dtype) -> None:
        stored = to_kernel_form(self.int_groups(layer), dtype)
        for name in [n for n in layer._parameters if n != "bias"]:
            delattr(layer, name)
        for name, tensor in stored.tensors().items():
            layer.register_parameter(f"int_{name}", nn.Parameter(tensor, requires_grad=False))
        self.stored = stored

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        assert self.stored is not None
        y = self.stored.product(x.reshape(-1, x.shape[-1]), bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def takes_prologue(self, x: torch.Tensor, kind: str) -> bool:
        """One row on the 4-bit row GEMV (gpu/kernels/int4_row_gemv.py), which has both prologues."""
        if self.stored is None or not x.is_cuda or x.dim() != 2 or x.shape[0] != 1:
            return False
        from gpu.kernels.int_gemm import row_prologue_tiles

        return x.dtype == self.stored.scales.dtype and row_prologue_tiles(x, self.stored) is not None

    def apply_normed(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor | None,
                     norm_weight: torch.Tensor, eps: float, bias: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.stored is not None
        from gpu.kernels.int_gemm import int_gemm_rms_norm

        return int_gemm_rms_norm(x, residual, norm_weight, eps, self.stored, bias)

    def apply_activated(self, layer: nn.Module, gate_up: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        assert self.stored is not None
        from gpu.kernels.int_gemm import int_gemm_silu_and_mul

        return int_gemm_silu_and_mul(gate_up, self.stored, bias)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        assert self.stored is not None
        return self.stored.int_groups().dequantize()

    def local_group_size(self) -> int:
        return self.group_size or self.layout.in_features
