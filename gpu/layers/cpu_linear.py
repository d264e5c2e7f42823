"""Linear weights packed once after loading, in the forms the CPU's fastest matmuls read.

At batch 1 a decode step reads every weight once, so on a CPU its time is the weights' bytes over
the memory bandwidth plus the calls' overhead. Two packed forms, both for bfloat16 activations:

- `Int4Groups`: a weight whose rows lie exactly on a 4-bit grid per group of 32 columns (a scale
  and a minimum per group, the Q4_1 scheme; the dequantized weights of a Q4_1 GGUF do) is kept as
  those 4-bit values and multiplied by torch's int4 CPU kernel: a quarter of bfloat16's bytes, and
  the same weights up to the bfloat16 rounding of each group's scale and zero point (the kernel
  takes them in the activations' dtype). Never a lossy quantization: a weight off the grid, even by
  a little, is not packed so.
- `OneDnnWeight`: any other weight, rounded to bfloat16, in oneDNN's blocked layout
  (`mkldnn._reorder_linear_weight`), which F.linear in bfloat16 would otherwise re-lay-out at every
  call; the products are the same bits as F.linear's.

Float32 runs keep F.linear (the parity reference).
"""

import torch

GROUP_SIZE = 32  # columns per 4-bit group: Q4_1's block size
GRID_TOLERANCE = 1e-3  # in grid steps: a dequantized Q4_1 weight is on its grid to float32 rounding (~1e-6)
LEVELS = 15  # 4 bits: values 0..15 above the group's minimum


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


PackedWeight = Int4Groups | OneDnnWeight


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    """The fastest exact form of `weight` [out, in] for bfloat16 activations on this CPU."""
    return int4_groups(weight) or OneDnnWeight(weight)


def int4_groups(weight: torch.Tensor) -> Int4Groups | None:
    """`weight` as 4-bit groups when every group of GROUP_SIZE columns lies on the 4-bit grid from its
    minimum to its maximum; None when it does not, or when the kernel cannot take its shape."""
    out_features, in_features = weight.shape
    if out_features % 16 or in_features % GROUP_SIZE:  # the kernel's packing takes rows in sixteens
        return None
    groups = weight.float().view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    minimums, maximums = groups.amin(-1), groups.amax(-1)
    scales = (maximums - minimums) / LEVELS
    steps = torch.where(scales > 0, scales, 1.0).unsqueeze(-1)  # a constant group is all level 0
    levels = (groups - minimums.unsqueeze(-1)) / steps
    rounded = levels.round()
    if (levels - rounded).abs().max() > GRID_TOLERANCE:
        return None
    return Int4Groups(rounded.to(torch.int32).view(out_features, in_features), scales, minimums)

