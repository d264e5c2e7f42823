"""Triton helpers of the products' prologues: the elementwise kernel before a product, computed inside it (a launch
less; at a few rows each launch costs more than its bytes). gpu/kernels/skinny_gemm.py (bf16/fp16 weights) and
gpu/kernels/int4_row_gemv.py (4-bit weights) share them, so their inputs round alike: `RMS_NORM`, the residual add
and RMSNorm of gpu/kernels/rms_norm.py, and `SILU_AND_MUL`, silu(gate) * up of gpu/kernels/silu_and_mul.py, rounded
to the model dtype where those kernels round. The elementwise helpers take float32 values and round them themselves;
`rms_norm_rstd` sums a row's squares over all of K before the product's loop (each program its own, from L2).
"""

import triton
import triton.language as tl

from gpu.kernels.triton_math import add

NO_PROLOGUE = tl.constexpr(0)
RMS_NORM = tl.constexpr(1)  # x := norm(x + residual) * norm_weight
SILU_AND_MUL = tl.constexpr(2)  # x := silu(x[:, :K]) * x[:, K:]
VECTOR = tl.constexpr(8)  # elements of one 16-byte load of a 16-bit float: one row sums them within their thread


@triton.jit
def residual_sum(x, residual, dtype: tl.constexpr):
    """x + residual (float32 values of the model dtype) rounded to `dtype`, as the torch path's `x + residual`."""
    return (x + residual).to(dtype)


@triton.jit
def rms_normed(s, rstd, weight, dtype: tl.constexpr):
    """weight * (s * rstd) in `dtype` with Llama's rounding: the normed value first, then its product."""
    normed = (s * rstd).to(dtype).to(tl.float32)
    return (weight.to(tl.float32) * normed).to(dtype)


@triton.jit
def silu_times_up(gate, up, dtype: tl.constexpr):
    """silu(gate) * up (float32 values) in `dtype`, rounded after the activation and after the product."""
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def load_along_k(ptrs, k_mask, EVEN_K: tl.constexpr):
    """A tile whose K positions past the end (k_mask false) read as zeros; with EVEN_K there are none, and no mask
    (copies of one row then load once per thread: the compiler merges unmasked loads of one address only)."""
    if EVEN_K:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=k_mask, other=0.0)
    return tile


@triton.jit
def sum_tile(x_ptr, res_ptr, rows, ks, k_mask, stride_xm, stride_rm, HAS_RESIDUAL: tl.constexpr,
             EVEN_K: tl.constexpr):
    """x + residual over [rows, ks], rounded to the model dtype as gpu/kernels/rms_norm.py rounds it."""
    x = load_along_k(x_ptr + rows[:, None] * stride_xm + ks[None, :], k_mask[None, :], EVEN_K)
    if HAS_RESIDUAL:
        residual = load_along_k(res_ptr + rows[:, None] * stride_rm + ks[None, :], k_mask[None, :], EVEN_K)
        x = residual_sum(x.to(tl.float32), residual.to(tl.float32), x_ptr.dtype.element_ty)
    return x


@triton.jit
def rms_norm_rstd(x_ptr, res_ptr, sum_ptr, rows, offs_m, M, K, stride_xm, stride_rm, eps, writes_sum,
                  HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean((x + residual)^2) + eps) per row over the whole of K; where `writes_sum` (one program of the
    grid) also stores x + residual, the residual stream the next block reads. One row sums its squares within each
    thread's vectors, tile after tile, and across the warps once, after the loop (a sum per tile crosses the warps
    through shared memory, with barriers, every time); tiles of rows sum each tile's."""
    if BLOCK_M == 1:
        sum_sq = tl.full((1, BLOCK_K // VECTOR), 0.0, tl.float32)
    else:
        sum_sq = tl.full((BLOCK_M,), 0.0, tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        s = sum_tile(x_ptr, res_ptr, rows, ks, k_mask, stride_xm, stride_rm, HAS_RESIDUAL, EVEN_K)
        if HAS_RESIDUAL:
            if writes_sum:
                tl.store(sum_ptr + offs_m[:, None] * K + ks[None, :], s,
                         mask=(offs_m[:, None] < M) & k_mask[None, :])
        s = s.to(tl.float32)
        if BLOCK_M == 1:
            sum_sq += tl.reduce(tl.reshape(s * s, (1, BLOCK_K // VECTOR, VECTOR)), 2, add)
        else:
            sum_sq += tl.reduce(s * s, 1, add)
    if BLOCK_M == 1:
        sum_sq = tl.reduce(sum_sq, 1, add)
    return tl.math.rsqrt(sum_sq / K + eps)
