"""Triton kernel: residual add fused with RMSNorm, one program per token row.

Computes s = x + residual (rounded to the model dtype, as the torch path's `x + residual` is), then
norm(s) = weight * (s * rsqrt(mean(s^2) + eps)).to(dtype) in float32 (Llama's convention), or
((s * rsqrt(mean(s^2) + eps)) * (offset + weight)).to(dtype) (Gemma's: gpu/layers/norm.py's NormConvention),
rounded at the same points as gpu/layers/norm.py (the reference), so float32 matches it to rounding and
bf16/fp16 almost always to the bit. Without a residual the sum is x itself and only the norm is written.
Invariants the wrapper checks: x (and residual) are 2-d [num_tokens, hidden] with unit stride
along hidden (any row stride), alike in shape and dtype; weight is [hidden] in x's dtype; a whole
row fits one program (hidden <= 32768). Outputs are new contiguous tensors; shapes depend only on
the inputs' shapes, so the call is safe inside a CUDA graph.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import add

MAX_HIDDEN = 32768


@triton.jit
def normed_row(
    x_ptr, residual_ptr, weight_ptr, sum_ptr, row, columns, x_stride, residual_stride, eps,
    DTYPE: tl.constexpr, HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr, SCALES_IN_FLOAT32: tl.constexpr,
):
    """Row `row`'s norm(x + residual) [BLOCK] in DTYPE, rounded as the reference rounds it, after storing
    x + residual into sum_ptr's row where there is a residual. Only the first `columns` (HIDDEN, or 0 for a row
    that is none of x's) are read and stored: zeros past them."""
    cols = tl.arange(0, BLOCK)
    mask = cols < columns
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0).to(tl.float32)
        # Rounded before the norm: the torch path adds in the model dtype, and this sum is also the
        # residual stream the next block reads.
        x = (x + residual).to(DTYPE)
        tl.store(sum_ptr + row * HIDDEN + cols, x, mask=mask)
        x = x.to(tl.float32)
    variance = tl.reduce(x * x, 0, add) / HIDDEN  # tl.sum's reduction, which the interpreter runs nested
    normed = x * tl.math.rsqrt(variance + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALES_IN_FLOAT32:
        out = normed * (WEIGHT_OFFSET + weight)
    else:
        out = weight * normed.to(DTYPE).to(tl.float32)
    return out.to(DTYPE)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    x_stride,
    residual_stride,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    WEIGHT_OFFSET: tl.constexpr,
    SCALES_IN_FLOAT32: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    out = normed_row(x_ptr, residual_ptr, weight_ptr, sum_ptr, row, HIDDEN, x_stride, residual_stride, eps,
                     out_ptr.dtype.element_ty, HIDDEN, BLOCK, HAS_RESIDUAL, WEIGHT_OFFSET, SCALES_IN_FLOAT32)
    tl.store(out_ptr + row * HIDDEN + cols, out, mask=cols < HIDDEN)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
    use_pdl: bool = False,  # a programmatic dependent launch where the GPU has it (gpu/kernels/pdl.py)
    weight_offset: float = 0.0,  # Gemma's convention (gpu/layers/norm.py): scale by offset + weight ...
    scales_in_float32: bool = False,  # ... in float32, rounded once
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (norm(x + residual), x + residual); without a residual, (norm(x), x)."""
    check_norm_inputs(x, weight, residual)
    num_tokens, hidden = x.shape
    out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else x
    if num_tokens == 0:
        return out, summed
    block = triton.next_power_of_2(hidden)
    pdl = uses_pdl(use_pdl, x)
    _rms_norm_kernel[(num_tokens,)](
        x, residual if residual is not None else x, weight, out, summed,
        x.stride(0), residual.stride(0) if residual is not None else 0, eps,
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        WEIGHT_OFFSET=weight_offset,
        SCALES_IN_FLOAT32=scales_in_float32,
        USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=norm_warps(block),
        enable_fp_fusion=False,  # no mul+add into one FMA: torch rounds the product first
    )
    return out, summed


def norm_warps(block: int) -> int:
    """About 8 elements (16 bytes of bf16) per thread and load, up to 16 warps."""
    return min(max(block // 256, 1), 16)


def check_norm_inputs(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be 2-d [num_tokens, hidden] with unit stride along hidden, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    if x.shape[1] > MAX_HIDDEN:
        raise ValueError(f"hidden size {x.shape[1]} exceeds one program's row ({MAX_HIDDEN})")
    if weight.shape != (x.shape[1],) or weight.dtype != x.dtype or not weight.is_contiguous():
        got = f"{weight.dtype} {tuple(weight.shape)}"
        raise ValueError(f"weight must be contiguous [{x.shape[1]}] {x.dtype}, got {got}")
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(1) != 1:
            raise ValueError(f"residual must match x ({x.dtype} {tuple(x.shape)}, unit stride along hidden), "
                             f"got {residual.dtype} {tuple(residual.shape)} strides {residual.stride()}")
