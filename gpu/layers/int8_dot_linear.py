"""Linear weights on their GGUF grid, multiplied by integer dot products (gpu/cpu_kernels/int8_dot.c).

Two forms, each a group of 32 input columns with float16 scales, as GGUF's Q4_1 and Q8_0 blocks store them (float32
where a weight's are no float16, as Q4_K's sub-block scales):
- `Int4DotGroups`: w = scale * level + minimum, level 0..15 (Q4_1; Q4_0 too, with minimum = -8 * scale; Q4_K);
- `Int8DotGroups`: w = scale * level, level -127..127 (Q8_0; Q5_0's levels fit too), or with a scale per half group
  of 16 columns (Q6_K's sub-blocks, levels -32..31).
The activations are quantized per row and group of 32 to 16 bits as two int8 passes (a float32 scale each group), so
a product differs from the float one by that rounding: at most half a step of 1/(127 * 256) of each group's largest
activation, per activation. The weights are the grid's own values: scales and minimums are held in float16 only where
they are float16 values.

Both take float32 or bfloat16 activations and return the same dtype. The kernel's layout (its tiles of output rows and
how a quad of 4 columns is laid out) is written here, from the constants the compiled kernel states.
"""

from types import ModuleType
from typing import TYPE_CHECKING

import torch

from gpu.cpu_kernels import ACTIVATION_DTYPES

if TYPE_CHECKING:
    from gpu.layers.norm import RMSNorm

GROUP_SIZE = 32  # input columns per group: GGUF's block size for Q4_0, Q4_1, Q5_0 and Q8_0
# The gated activations the kernel computes before a product, by gpu/layers/activation.py's names: its codes.
GATED_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


class Int8DotProduct:
    """x @ W.T for a W packed in the kernel's layout: one call of the compiled kernel per product, which may compute
    its own input first (an RMSNorm after a residual add, or SiLU-and-mul), as the CUDA kernels' prologues do."""

    kind = "int8 dot products"

    def __init__(self, kernels: ModuleType, out_features: int, in_features: int,
                 tensors: tuple[torch.Tensor, ...]) -> None:
        """tensors: (levels, scales) or (levels, scales, minimums), in the kernel's layout (scales and minimums
        float16, or float32 where a group's are no float16; an 8-bit weight's scales per group or per half group)."""
        self.out_features, self.in_features = out_features, in_features
        self._tensors = tensors  # kept alive: the kernel reads them through the handle's pointers
        minimums = tensors[2].data_ptr() if len(tensors) == 3 else None
        per_half = int(tensors[1].shape[1] == 2 * in_features // GROUP_SIZE)
        self._weights = kernels.weights(tensors[0].data_ptr(), tensors[1].data_ptr(), minimums, out_features,
                                        in_features, int(tensors[1].dtype == torch.float32), per_half)
        self._kernels = kernels

    @property
    def handle(self) -> object:
        """The compiled kernel's handle of this weight (gpu/cpu_decode.py calls the kernels with it)."""
        return self._weights

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = _rows(x, self.in_features)
        out = torch.empty(rows.shape[0], self.out_features, dtype=rows.dtype)
        bias = None if bias is None else bias.to(rows.dtype)
        self._kernels.linear(self._weights, rows.data_ptr(), rows.stride(0), rows.shape[0], _pointer(bias),
                             out.data_ptr(), _is_bf16(rows))
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def normed(self, x: torch.Tensor, residual: torch.Tensor | None, norm: "RMSNorm",
               bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual) @ W.T + bias, x + residual) for x, residual [rows, in_features] and the rest in x's
        dtype (`takes`), the norm in its family's convention (gpu/layers/norm.py)."""
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        summed = x if residual is None else torch.empty_like(x)
        offset, in_float32 = norm_convention(norm)
        self._kernels.linear_normed(
            self._weights, x.data_ptr(), x.stride(0), _pointer(residual), 0 if residual is None else residual.stride(0),
            norm.weight.data_ptr(), norm.eps, summed.data_ptr(), x.shape[0], _pointer(bias), out.data_ptr(),
            _is_bf16(x), None, offset, in_float32)
        return out, summed

    def gated(self, gate_up: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
        """(act(gate) * up) @ W.T + bias for gate_up [rows, 2 * in_features] = [gate | up] (`takes`), act one of
        GATED_ACTIVATIONS."""
        out = torch.empty(gate_up.shape[0], self.out_features, dtype=gate_up.dtype)
        self._kernels.linear_gated(self._weights, gate_up.data_ptr(), gate_up.stride(0), gate_up.shape[0],
                                   _pointer(bias), out.data_ptr(), _is_bf16(gate_up), GATED_ACTIVATIONS[activation])
        return out

    @staticmethod
    def takes(x: torch.Tensor, *others: torch.Tensor | None) -> bool:
        """Whether the prologues read these [rows, columns] tensors as they are: rows of contiguous columns, one
        dtype the kernel takes."""
        return x.dim() == 2 and x.stride(1) == 1 and x.dtype in ACTIVATION_DTYPES and all(
            t is None or (t.dim() in (1, 2) and t.stride(-1) == 1 and t.dtype == x.dtype) for t in others)


class Int4DotGroups(Int8DotProduct):
    kind = "4-bit groups, int8 dot products"

    @classmethod
    def pack(cls, kernels: ModuleType, levels: torch.Tensor, scales: torch.Tensor,
             minimums: torch.Tensor) -> "Int4DotGroups | None":
        """levels: [out, in] integers in 0..15; scales, minimums: [out, in / GROUP_SIZE], so that
        W = levels * scale + minimum per group. None where the kernel cannot take the shape."""
        if not fits(kernels, levels.shape):
            return None
        quads = _quads(levels.to(torch.uint8), kernels.TILE_ROWS)  # [tiles, groups, 8, tile rows, 4]
        nibbles = quads[:, :, :4] | (quads[:, :, 4:] << 4)  # quads j and j + 4 share bytes
        return cls(kernels, *levels.shape, (nibbles.contiguous(), *_tiled(kernels.TILE_ROWS, scales, minimums)))


class Int8DotGroups(Int8DotProduct):
    kind = "8-bit groups, int8 dot products"

    @classmethod
    def pack(cls, kernels: ModuleType, levels: torch.Tensor, scales: torch.Tensor) -> "Int8DotGroups | None":
        """levels: [out, in] integers in -127..127; scales: [out, in / GROUP_SIZE] (or [out, 2 * in / GROUP_SIZE],
        one per half group), so that W = levels * scale per group (or half). None where the kernel cannot take the
        shape."""
        if not fits(kernels, levels.shape):
            return None
        quads = _quads(levels.to(torch.int16), kernels.TILE_ROWS)
        # Where the CPU has VNNI, the kernel multiplies unsigned weights by signed activations: level + 128.
        stored = (quads + 128).to(torch.uint8) if kernels.OFFSET_BYTES else quads.to(torch.int8)
        return cls(kernels, *levels.shape, (stored.contiguous(), *_tiled(kernels.TILE_ROWS, scales)))


def norm_convention(norm: "RMSNorm") -> tuple[float, int]:
    """(weight offset, whether Gemma's float32 scaling) of a norm, as the kernels take them."""
    return norm.convention.weight_offset, int(norm.convention.scales_in_float32)


def _rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x as [rows, in_features] of contiguous columns in a dtype the kernel takes."""
    rows = x.reshape(-1, in_features)
    if rows.dtype not in ACTIVATION_DTYPES:
        rows = rows.float()
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _is_bf16(x: torch.Tensor) -> int:
    return int(x.dtype == torch.bfloat16)


def fits(kernels: ModuleType, shape: torch.Size) -> bool:
    """Whether the kernel takes a weight of this shape: whole tiles of output rows, whole groups of columns."""
    out_features, in_features = shape
    return out_features % kernels.TILE_ROWS == 0 and in_features % GROUP_SIZE == 0 and in_features > 0


def _quads(levels: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """[out, in] -> [tiles, groups, 8 quads, tile rows, 4 columns]: one lane per output row."""
    out_features, in_features = levels.shape
    grouped = levels.view(out_features // tile_rows, tile_rows, in_features // GROUP_SIZE, 8, 4)
    return grouped.permute(0, 2, 3, 1, 4)


def _tiled(tile_rows: int, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A weight's [out, groups] scales (and minimums) -> [tiles, groups, tile rows] each (per half group: [out,
    2 * groups] -> [tiles, groups, 2 halves, tile rows], as the kernel reads them): float16, as a GGUF stores
    them (Q4_0, Q4_1, Q5_0, Q8_0), where every value is one to float32 rounding (a scale found as a group's range / 15
    may be off by it); else float32, which the kernel reads too (Q4_K's: a 6-bit integer times a float16)."""
    is_float16 = all(((v.float().half().float() - v.float()).abs() <= 1e-6 * v.float().abs()).all() for v in values)
    dtype = torch.float16 if is_float16 else torch.float32
    return tuple(v.view(v.shape[0] // tile_rows, tile_rows, v.shape[1]).permute(0, 2, 1).to(dtype).contiguous()
                 for v in values)
