"""Linear weights packed once after loading, in the forms the CPU's fastest matmuls read.

At batch 1 a decode step reads every weight once, so on a CPU its time is the weights' bytes over
the memory bandwidth plus the calls' overhead. Three packed forms, all for bfloat16 activations:

- `Int4Groups`: a weight whose rows lie exactly on a 4-bit grid per group of 32 columns (a scale
  and a minimum per group, the Q4_1 scheme; the dequantized weights of a Q4_1 GGUF do) is kept as
  those 4-bit values and multiplied by torch's int4 CPU kernel: a quarter of bfloat16's bytes, and
  the same weights up to the bfloat16 rounding of each group's scale and zero point (the kernel
  takes them in the activations' dtype).
- `Int8Groups`: a weight on a symmetric 8-bit grid per group of 32 (a scale per group, the Q8_0
  scheme: a Q8_0 GGUF's, and the token embedding of the default model, which its LM head shares) is
  kept as two 4-bit planes (the 8-bit value + 128 = 16 * high + low), each through the int4 kernel,
  their outputs summed in float32: half of bfloat16's bytes, the same weights up to the bfloat16
  rounding of each group's scale. torch's int8 kernel takes one scale per row, not per group.
- `OneDnnWeight`: any other weight, rounded to bfloat16, in oneDNN's blocked layout
  (`mkldnn._reorder_linear_weight`), which F.linear in bfloat16 would otherwise re-lay-out at every
  call; the products are the same bits as F.linear's.

Never a lossy quantization: a weight off a grid, even by a little, is not packed on it. Float32
runs keep F.linear (the parity reference).
"""

import torch

GROUP_SIZE = 32  # columns per 4-bit group: Q4_1's block size
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


PackedWeight = Int4Groups | Int8Groups | OneDnnWeight


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    """The fastest exact form of `weight` [out, in] for bfloat16 activations on this CPU."""
    return int4_groups(weight) or int8_groups(weight) or OneDnnWeight(weight)


def int4_groups(weight: torch.Tensor) -> Int4Groups | None:
    """`weight` as 4-bit groups when every group of GROUP_SIZE columns lies on the 4-bit grid from its
    minimum to its maximum; None when it does not, or when the kernel cannot take its shape."""
    groups = _groups(weight)
    if groups is None:
        return None
    minimums, maximums = groups.amin(-1), groups.amax(-1)
    scales = (maximums - minimums) / 15
    levels = _levels(groups - minimums.unsqueeze(-1), scales)
    return None if levels is None else Int4Groups(levels.view(weight.shape), scales, minimums)


def int8_groups(weight: torch.Tensor) -> Int8Groups | None:
    """`weight` as symmetric 8-bit groups when every group of GROUP_SIZE columns lies on the grid of
    multiples of its largest magnitude / 127; None when it does not, or when the kernel cannot take its shape."""
    groups = _groups(weight)
    if groups is None:
        return None
    scales = groups.abs().amax(-1) / 127
    levels = _levels(groups, scales)
    return None if levels is None else Int8Groups(levels.view(weight.shape), scales)


def _groups(weight: torch.Tensor) -> torch.Tensor | None:
    """[out, in / GROUP_SIZE, GROUP_SIZE] float32, or None for a shape the int4 kernel cannot take."""
    out_features, in_features = weight.shape
    if out_features % 16 or in_features % GROUP_SIZE:  # the kernel's packing takes rows in sixteens
        return None
    return weight.float().view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)


def _levels(offsets: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """offsets / scale as int32 when every one is within GRID_TOLERANCE of an integer (a zero scale: level 0)."""
    steps = torch.where(scales > 0, scales, 1.0).unsqueeze(-1)
    levels = offsets / steps
    rounded = levels.round()
    if (levels - rounded).abs().max() > GRID_TOLERANCE:
        return None
    return rounded.to(torch.int32)

