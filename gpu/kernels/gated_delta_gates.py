"""Triton kernel: the gated delta rule's per-token decay and write strength from the input projection's a and b
columns, in one launch:
    beta = round(sigmoid(b))                                      in the activations' dtype
    g = -exp(A_log) * softplus(a + dt_bias)                       float32
with softplus(x) = x where x > 20, else log1p(exp(x)) (torch's threshold), computed as the torch path
(gpu/layers/gated_deltanet.py) computes them: float32 from the parameters and columns as loaded, torch's own exp,
log1p and division (gpu/kernels/triton_math.py), no fused multiply-add. Grid: blocks of tokens, every head in a
program. Invariants the wrapper checks: a and b [tokens, heads] in one dtype with unit column stride (any row
stride: columns of the projection's output), A_log and dt_bias contiguous [heads]. Outputs are new contiguous
tensors; shapes depend only on the inputs', so the call is safe inside a CUDA graph.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import exp, log1p, round_to

SOFTPLUS_THRESHOLD = 20.0  # torch's default: above it softplus(x) is x


@triton.jit
def _gated_delta_gates_kernel(
    a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, num_tokens, a_stride, b_stride,
    NUM_HEADS: tl.constexpr, THRESHOLD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    heads = tl.arange(0, BLOCK_H)
    head_mask = heads < NUM_HEADS
    mask = (tokens < num_tokens)[:, None] & head_mask[None, :]
    a = tl.load(a_ptr + tokens[:, None] * a_stride + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + tokens[:, None] * b_stride + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(a_log_ptr + heads, mask=head_mask, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + heads, mask=head_mask, other=0.0).to(tl.float32)
    x = a + dt_bias[None, :]
    softplus = tl.where(x > THRESHOLD, x, log1p(exp(x)))
    g = -exp(a_log)[None, :] * softplus
    beta = tl.math.div_rn(1.0, 1.0 + exp(-b))
    out_offsets = tokens[:, None] * NUM_HEADS + heads[None, :]
    tl.store(g_ptr + out_offsets, g, mask=mask)
    tl.store(beta_ptr + out_offsets, round_to(beta, beta_ptr.dtype.element_ty), mask=mask)


def gated_delta_gates(
    a: torch.Tensor,  # [num_tokens, heads]
    b: torch.Tensor,  # [num_tokens, heads], a's dtype
    a_log: torch.Tensor,  # [heads]
    dt_bias: torch.Tensor,  # [heads]
    use_pdl: bool = False,  # a programmatic dependent launch where the GPU has it (gpu/kernels/pdl.py)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g [num_tokens, heads] float32, beta [num_tokens, heads] in b's dtype)."""
    _check(a, b, a_log, dt_bias)
    num_tokens, num_heads = a.shape
    g = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=a.device)
    beta = torch.empty((num_tokens, num_heads), dtype=b.dtype, device=b.device)
    if num_tokens == 0 or num_heads == 0:
        return g, beta
    block_h = triton.next_power_of_2(num_heads)
    block_t = max(512 // block_h, 1)  # about 512 elements a program, whatever the step's tokens: one compile
    pdl = uses_pdl(use_pdl, a)
    _gated_delta_gates_kernel[(triton.cdiv(num_tokens, block_t),)](
        a, b, a_log, dt_bias, g, beta, num_tokens, a.stride(0), b.stride(0),
        NUM_HEADS=num_heads, THRESHOLD=SOFTPLUS_THRESHOLD, BLOCK_T=block_t, BLOCK_H=block_h, USE_PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
        enable_fp_fusion=False,  # no mul+add into one FMA: torch rounds the product first
    )
    return g, beta


def _check(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor) -> None:
    if a.dim() != 2 or b.shape != a.shape or b.dtype != a.dtype or a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError(f"a and b must be alike [num_tokens, heads] with unit column stride, got {a.dtype} "
                         f"{tuple(a.shape)} strides {a.stride()} and {b.dtype} {tuple(b.shape)} strides {b.stride()}")
    for name, tensor in (("A_log", a_log), ("dt_bias", dt_bias)):
        if tensor.shape != (a.shape[1],) or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{a.shape[1]}], got {tuple(tensor.shape)}")
