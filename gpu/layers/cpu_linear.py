"""Linear weights packed once after loading, in the forms the CPU's fastest matmuls read, and which form a weight takes.

At batch 1 a decode step reads every weight once, so on a CPU its time is the weights' bytes over
the memory bandwidth plus the calls' overhead. A weight that lies exactly on a grid of groups of 32 columns is kept
on it, as the GGUF file stored it:
- 4-bit groups (a scale and a minimum per group: Q4_1; the dequantized weights of a Q4_1 GGUF lie on it; Q4_K's
  groups of 32 too, their scales and minimums held in float32 where no float16) and
- 8-bit groups (a scale per group, levels -127..127: Q8_0; the default model's token embedding, which its LM head
  shares; Q5_0, whose levels -16..15 fit), or a scale per half group of 16 columns (Q6_K's sub-blocks: a 6-bit level
  times an 8-bit integer times a float16, kept in float32; through the integer dot products only).
Where the integer dot-product kernels were built (gpu/cpu_kernels/int8_dot.c, any x86-64 CPU with AVX2 and a C
compiler), both go through them, for float32 or bfloat16 activations (gpu/layers/int8_dot_linear.py): a fifth of
float32's bytes for 4-bit groups, the activations quantized to int8 per group of 32 as llama.cpp does. Elsewhere, in
bfloat16 only, torch's int4 CPU kernel takes them:

- `Int4Groups`: the 4-bit values through torch's int4 kernel: the same weights up to the bfloat16 rounding of each
  group's scale and zero point (the kernel takes them in the activations' dtype).
- `Int8Groups`: the 8-bit values as two 4-bit planes (the 8-bit value + 128 = 16 * high + low), each through the
  int4 kernel, their outputs summed in float32: the same weights up to the bfloat16 rounding of each group's scale.
  torch's int8 kernel takes one scale per row, not per group.
- `OneDnnWeight` (bfloat16 only): any other weight, rounded to bfloat16, in oneDNN's blocked layout
  (`mkldnn._reorder_linear_weight`), which F.linear in bfloat16 would otherwise re-lay-out at every
  call; the products are the same bits as F.linear's. Not where oneDNN has no bfloat16 layout for the CPU (it needs
  AVX512 or AVX-NE-CONVERT): the weight stays as loaded.

Never a lossy quantization of a weight: a weight off a grid, even by a little, is not packed on it. Runs built with
`KernelConfig.cpu_packed_weights` off keep F.linear (the float32 parity reference).
"""

from dataclasses import dataclass
from functools import cache
from types import ModuleType

import torch

from gpu.layers.int8_dot_linear import GROUP_SIZE, Int4DotGroups, Int8DotGroups

GRID_TOLERANCE = 1e-3  # in grid steps: a dequantized Q4_1 weight is on its grid to float32 rounding (~1e-6)


class Int4Groups:
    """x @ W.T for a W stored as 4-bit values with a bfloat16 (scale, zero point) per group of columns."""

    kind = "int4 groups"

    def __init__(self, levels: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> None:
        """levels: [out, in] int32 in 0..15; scales, minimums: [out, in / GROUP_SIZE] float32, so that
        W = levels * scale + minimum per group."""
        self.out_features = levels.shape[0]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1)  # [out, in / 2] uint8
        # The kernel computes (level - 8) * scale + zero.
        zeros = minimums + 8 * scales
        self.scales_and_zeros = torch.stack([scales, zeros], -1).transpose(0, 1).contiguous().bfloat16()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP_SIZE, self.scales_and_zeros)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if bias is None else out + bias


@cache
def onednn_lays_out_bfloat16() -> bool:
    """Whether oneDNN takes bfloat16 linear weights in its own layout on this CPU (it refuses where the CPU lacks the
    instructions its bfloat16 kernels use)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 32, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


class OneDnnWeight:
    """x @ W.T for a bfloat16 W held in oneDNN's layout."""

    kind = "bfloat16 (oneDNN layout)"

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16().contiguous(), 1)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


class Int8Groups:
    """x @ W.T for a W = scale * level per group of columns, level in -127..127, as two planes of 4-bit values."""

    kind = "int8 groups (two 4-bit planes)"

    def __init__(self, levels: torch.Tensor, scales: torch.Tensor) -> None:
        """levels: [out, in] int32 in -127..127; scales: [out, in / GROUP_SIZE] float32."""
        shifted = levels + 128  # 1..255 = 16 * high + low
        # Each plane centred on zero (its own rounding stays small): high * 16s - 120s and low * s - 8s sum to
        # (16 * high + low - 128) * s = level * s.
        self.high = Int4Groups(shifted >> 4, 16 * scales, -120 * scales)
        self.low = Int4Groups(shifted & 15, scales, -8 * scales)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.high(x, None).float().add_(self.low(x, None)).to(x.dtype)
        return out if bias is None else out + bias


PackedWeight = Int4Groups | Int8Groups | OneDnnWeight | Int4DotGroups | Int8DotGroups


@dataclass(frozen=True)
class CpuPacking:
    """Which packed forms this CPU's products take: the integer dot-product kernels where they were built
    (gpu/cpu_kernels/int8_dot.c), for float32 or bfloat16 activations; else, in bfloat16, torch's int4 kernel."""

    dtype: torch.dtype  # the activations'
    int8_dot: ModuleType | None  # the compiled kernels, or None where they could not be built

    def pack(self, weight: torch.Tensor) -> PackedWeight | None:
        """The fastest form of `weight` [out, in] that keeps its values: its 4-bit or 8-bit groups where it lies on
        one of their grids, else (in bfloat16) oneDNN's layout; None: keep the weight as it is."""
        weight = weight.float()
        packed = None
        if (found := int4_grid(weight)) is not None:
            packed = self.pack_int4_groups(*found)
        elif (found := int8_grid(weight)) is not None:
            packed = self.pack_int8_groups(*found)
        if packed is None and self.dtype == torch.bfloat16 and onednn_lays_out_bfloat16():
            return OneDnnWeight(weight)
        return packed

    def pack_int4_groups(self, levels: torch.Tensor, scales: torch.Tensor,
                         minimums: torch.Tensor) -> Int4DotGroups | Int4Groups | None:
        """W = levels * scale + minimum per group of GROUP_SIZE columns (levels [out, in] in 0..15; scales,
        minimums [out, in / GROUP_SIZE]): a GGUF's Q4_1 blocks, or Q4_0's with minimum = -8 * scale."""
        if self.int8_dot is not None:
            return Int4DotGroups.pack(self.int8_dot, levels, scales, minimums)
        if self.dtype == torch.bfloat16 and torch_int4_fits(levels.shape):
            return Int4Groups(levels.to(torch.int32), scales.float(), minimums.float())
        return None

    def pack_int8_groups(self, levels: torch.Tensor, scales: torch.Tensor) -> Int8DotGroups | Int8Groups | None:
        """W = levels * scale per group of GROUP_SIZE columns (levels [out, in] in -127..127; scales
        [out, in / GROUP_SIZE]): a GGUF's Q8_0 blocks; or per half group (scales [out, 2 * in / GROUP_SIZE]: Q6_K's),
        which torch's int4 kernel does not take."""
        if self.int8_dot is not None:
            return Int8DotGroups.pack(self.int8_dot, levels, scales)
        per_group = scales.shape[1] * GROUP_SIZE == levels.shape[1]
        if self.dtype == torch.bfloat16 and torch_int4_fits(levels.shape) and per_group:
            return Int8Groups(levels.to(torch.int32), scales.float())
        return None


def int4_grid(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(levels, scales, minimums) when every group of GROUP_SIZE columns of `weight` [out, in] lies on a 4-bit grid
    from its minimum: of 15 steps to its maximum (Q4_0's, Q4_1's), or else of its own smallest step, levels 0..15
    (Q4_K's groups need not span all 16 levels); else None."""
    groups = _groups(weight)
    if groups is None:
        return None
    minimums, maximums = groups.amin(-1), groups.amax(-1)
    scales = (maximums - minimums) / 15
    offsets = groups - minimums.unsqueeze(-1)
    levels = _levels(offsets, scales)
    if levels is None:
        if (found := _on_smallest_steps(offsets, 15)) is None:
            return None
        levels, scales = found
    return levels.view(weight.shape), scales, minimums


def int8_grid(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(levels, scales) when every group of GROUP_SIZE columns of `weight` [out, in] lies on a grid of multiples of
    a step, levels -127..127: its largest magnitude / 127 (Q8_0's), or else its own smallest step, a float16 (Q5_0's
    levels -16..15 of a float16 scale need not reach 127); or else every half group of 16 columns on its own smallest
    step (Q6_K's sub-blocks), scales [out, 2 * in / GROUP_SIZE]; else None."""
    groups = _groups(weight)
    if groups is None:
        return None
    scales = groups.abs().amax(-1) / 127
    levels = _levels(groups, scales)
    if levels is None:
        found = _on_smallest_steps(groups, 127)
        if found is None or not torch.equal(found[1].half().float(), found[1]):
            halves = groups.view(groups.shape[0], -1, GROUP_SIZE // 2)
            found = _on_smallest_steps(halves, 127)
            if found is None:
                return None
            # A step found as a gap between two values carries their rounding: the least-squares step of the whole
            # half group is the file's (a float16 times an 8-bit integer, which float32 holds exactly).
            levels = found[0].double()
            fitted = (halves.double() * levels).sum(-1) / (levels * levels).sum(-1).clamp(min=1)
            found = found[0], fitted.float()
        levels, scales = found
    return levels.view(weight.shape), scales


def _on_smallest_steps(values: torch.Tensor, most: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(levels, steps) of `values` [out, groups, size] in whole numbers of each group's smallest step, at most
    `most` of them; None where a group is off it. The first row is tried first: a weight off every grid costs a row."""
    found = None
    for part in (values[:1], values):
        steps = _smallest_steps(part)
        if ((steps == 0) & (part.abs().amax(-1) > 0)).any():  # a group with values and no step found
            return None
        levels = _levels(part, steps)
        if levels is None or levels.abs().max() > most:
            return None
        found = levels, steps
    return found


def torch_int4_fits(shape: torch.Size) -> bool:
    """Whether torch's int4 kernel takes a weight of this shape: its packing takes rows in sixteens."""
    return shape[0] % 16 == 0


def _groups(weight: torch.Tensor) -> torch.Tensor | None:
    """[out, in / GROUP_SIZE, GROUP_SIZE] float32, or None where the columns are not whole groups."""
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE or in_features == 0:
        return None
    return weight.float().view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)


def _smallest_steps(groups: torch.Tensor) -> torch.Tensor:
    """[out, groups]: per group (of any size), the largest step of which every value is a multiple, tried among the
    smallest distance between two of its values or from zero, divided by 1 to 8 (a group whose levels are all even, or
    0, 3 and 5, has no two values one level apart); 0 where no such step is found or every value is zero."""
    values = torch.cat([groups, torch.zeros_like(groups[..., :1])], -1).sort(-1).values
    gaps = values.diff(dim=-1)
    tiny = values.abs().amax(-1, keepdim=True) * 1e-6  # equal values, up to float32 rounding, are one value
    smallest = torch.where(gaps > tiny, gaps, torch.inf).amin(-1)
    steps = torch.zeros_like(smallest)
    for divisor in range(8, 0, -1):  # the largest step that fits wins: the smallest divisor last
        step = smallest / divisor
        levels = groups / step.unsqueeze(-1)
        fits = ((levels - levels.round()).abs() <= GRID_TOLERANCE).all(-1) & torch.isfinite(step)
        steps = torch.where(fits, step, steps)
    return steps


def _levels(offsets: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """offsets / scale as int32 when every one is within GRID_TOLERANCE of an integer (a zero scale: level 0)."""
    steps = torch.where(scales > 0, scales, 1.0).unsqueeze(-1)
    levels = offsets / steps
    rounded = levels.round()
    if (levels - rounded).abs().max() > GRID_TOLERANCE:
        return None
    return rounded.to(torch.int32)

