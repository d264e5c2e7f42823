"""Triton kernel: the Gated DeltaNet's output norm, rms_norm(x) * weight * silu(gate) per head, in one launch.

From the delta rule's output x [tokens, heads, head_dim] (float32, or already the activations' dtype) and the gate
[tokens, heads, head_dim] in the activations' dtype, rounded where the torch path (gpu/layers/gated_deltanet.py's
`GatedRMSNorm`) rounds:
    x = round(x)                                      the layer's `out.to(dtype)`
    normed = round(x * rsqrt(mean(x^2) + eps))        float32 norm
    scaled = round(weight * normed)                   a product of two dtype values: exact in float32, rounded once
    out = round(scaled * silu(gate))                  float32, rounded once
with torch's own exp, rsqrt and division (gpu/kernels/triton_math.py), no fused multiply-add, so the result is
torch's to the bit but where the sum of squares, added in another order, differs in its last bit. Grid: (token,
block of heads). Invariants the wrapper checks: x and gate [tokens, heads, head_dim] with unit stride along
head_dim (any token and head strides), weight contiguous [head_dim] in the gate's dtype. The output is a new
contiguous tensor in the gate's dtype; shapes depend only on the inputs', so the call is safe inside a CUDA graph.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import exp, round_to, rsqrt

MAX_HEAD_DIM = 4096


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr, gate_ptr, weight_ptr, out_ptr,
    x_token_stride, x_head_stride, gate_token_stride, gate_head_stride, eps,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < HEAD_DIM
    mask = (heads < NUM_HEADS)[:, None] & col_mask[None, :]
    dtype = out_ptr.dtype.element_ty
    x_offsets = token * x_token_stride + heads[:, None] * x_head_stride + cols[None, :]
    x = tl.load(x_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
    x = round_to(x, dtype).to(tl.float32)
    variance = tl.math.div_rn(tl.sum(x * x, axis=1), HEAD_DIM * 1.0)  # as torch's mean: the sum, then divided
    normed = round_to(x * rsqrt(variance + eps)[:, None], dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    scaled = round_to(weight[None, :] * normed, dtype).to(tl.float32)
    gate_offsets = token * gate_token_stride + heads[:, None] * gate_head_stride + cols[None, :]
    gate = tl.load(gate_ptr + gate_offsets, mask=mask, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + exp(-gate))
    out_offsets = (token * NUM_HEADS + heads[:, None]) * HEAD_DIM + cols[None, :]
    tl.store(out_ptr + out_offsets, round_to(scaled * silu, dtype), mask=mask)


def gated_rms_norm(
    x: torch.Tensor,  # [num_tokens, heads, head_dim] float32 or the gate's dtype
    gate: torch.Tensor,  # [num_tokens, heads, head_dim]
    weight: torch.Tensor,  # [head_dim] in the gate's dtype
    eps: float,
    use_pdl: bool = False,  # a programmatic dependent launch where the GPU has it (gpu/kernels/pdl.py)
) -> torch.Tensor:
    """rms_norm(x) * weight * silu(gate) per head, [num_tokens, heads, head_dim] in the gate's dtype."""
    _check(x, gate, weight)
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=gate.dtype, device=gate.device)
    if num_tokens == 0 or num_heads == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(num_heads), max(2048 // block_d, 1))  # about 2048 elements a program
    pdl = uses_pdl(use_pdl, x)
    _gated_rms_norm_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        x, gate, weight, out, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1), eps,
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
        enable_fp_fusion=False,  # no mul+add into one FMA: torch rounds the product first
    )
    return out


def _check(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 3 or gate.shape != x.shape or x.stride(2) != 1 or gate.stride(2) != 1:
        raise ValueError(f"x and gate must be alike [num_tokens, heads, head_dim] with unit stride along head_dim, got "
                         f"{tuple(x.shape)} strides {x.stride()} and {tuple(gate.shape)} strides {gate.stride()}")
    if x.dtype not in (torch.float32, gate.dtype):
        raise ValueError(f"x must be float32 or the gate's {gate.dtype}, got {x.dtype}")
    if x.shape[2] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {x.shape[2]} exceeds one program's row ({MAX_HEAD_DIM})")
    if weight.shape != (x.shape[2],) or weight.dtype != gate.dtype or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [{x.shape[2]}] {gate.dtype}, got {weight.dtype} "
                         f"{tuple(weight.shape)}")
