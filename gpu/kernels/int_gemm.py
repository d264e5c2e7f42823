"""Triton kernel: W4A16 / W8A16 GEMM y = x @ W^T (+ bias), the integer weights dequantized inside the main loop.

x [M, K] bf16/fp16; W in gpu/quant/int_weights.py's stored form: `int_weight` int32 [N, K * BITS / 32] (levels
packed from the low bits along K), scales [N, groups], zero points [N, groups] or none (2^(BITS - 1)), and group ids
[K] or none (column k's group is k // group_size). Each [BLOCK_N, BLOCK_K] weight tile is unpacked, shifted by its
zero points and scaled in float32, rounded to x's dtype and multiplied on the tensor cores (float32 sums): a decode
step reads the packed bytes, a quarter (int4) or half (int8) of bf16's. Where groups are whole tiles (no group ids,
group_size a multiple of BLOCK_K) a tile's scales are one per row.

Grid and split-K as gpu/kernels/fp8_gemm.py's. No data-dependent control: CUDA-graph capturable.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.fp8_gemm import quant_gemm_tiles
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.skinny_gemm import _split_k_reduce_kernel  # one reduce kernel for every split-K GEMM here


@triton.jit(do_not_specialize=["M", "N"])
def _int_gemm_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, g_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split, group_size,
    stride_xm, stride_qn, stride_sn, stride_os, stride_om,
    BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_GROUP_IDS: tl.constexpr, TILE_GROUPS: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_PARTIAL: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pdl_start(USE_PDL)
    PER_WORD: tl.constexpr = 32 // BITS
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    offs_words = tl.arange(0, BLOCK_K // PER_WORD)
    shifts = (tl.arange(0, PER_WORD) * BITS)[None, None, :]
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + offs_k
        k_mask = ks < k_end
        x = tl.load(x_ptr + rows_x[:, None] * stride_xm + ks[None, :], mask=k_mask[None, :], other=0.0)
        word_cols = k // PER_WORD + offs_words  # one load per word, unpacked in registers
        words = tl.load(q_ptr + rows_w[:, None] * stride_qn + word_cols[None, :],
                        mask=(word_cols < (k_end + PER_WORD - 1) // PER_WORD)[None, :], other=0)
        levels = tl.reshape((words[:, :, None] >> shifts) & ((1 << BITS) - 1), (BLOCK_N, BLOCK_K)).to(tl.float32)
        if TILE_GROUPS:  # one group per tile: a scale (and zero) per row
            group = k // group_size
            scales = tl.load(s_ptr + rows_w * stride_sn + group).to(tl.float32)[:, None]
            if HAS_ZEROS:
                zeros = tl.load(z_ptr + rows_w * stride_sn + group).to(tl.float32)[:, None]
            else:
                zeros = tl.full((BLOCK_N, 1), 1 << (BITS - 1), tl.float32)
        else:
            if HAS_GROUP_IDS:
                groups = tl.load(g_ptr + ks, mask=k_mask, other=0)
            else:
                groups = ks // group_size
            where = rows_w[:, None] * stride_sn + groups[None, :]
            scales = tl.load(s_ptr + where).to(tl.float32)
            if HAS_ZEROS:
                zeros = tl.load(z_ptr + where).to(tl.float32)
            else:
                zeros = tl.full((BLOCK_N, 1), 1 << (BITS - 1), tl.float32)
        w = ((levels - zeros) * scales).to(x_ptr.dtype.element_ty)
        acc = tl.dot(x, tl.trans(w), acc)
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if IS_PARTIAL:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def int_gemm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
             group_ids: torch.Tensor | None, bits: int, bias: torch.Tensor | None = None, use_pdl: bool = True,
             out: torch.Tensor | None = None) -> torch.Tensor:  # [M, K] x [N, K * bits / 32] -> [M, N]
    m, k = x.shape
    n = weight.shape[0]
    if weight.dtype != torch.int32 or weight.shape[1] * 32 // bits != k or x.stride(1) != 1:
        raise ValueError(f"x [M, K] and int32 [N, K * {bits} / 32] expected, got {tuple(x.shape)} and "
                         f"{weight.dtype} {tuple(weight.shape)}")
    if scales.shape[0] != n or (zeros is not None and zeros.shape != scales.shape):
        raise ValueError(f"scales {tuple(scales.shape)} and zeros do not match [{n}, groups]")
    group_size = k // scales.shape[1] if group_ids is None else 0
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0:
        return y
    block_m, block_n, split, warps, stages = quant_gemm_tiles(m, n, k, 128, x.device)
    block_k, stages = 128, min(stages, 2)  # the unpacked tile lives in registers; two stages of x and words fit
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else y
    pdl = uses_pdl(use_pdl, x)
    tile_groups = group_ids is None and group_size % block_k == 0
    _int_gemm_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)](
        x, weight, scales, zeros if zeros is not None else scales, group_ids if group_ids is not None else weight,
        bias if bias is not None else scales, part, m, n, k, k_per_split, max(group_size, 1),
        x.stride(0), weight.stride(0), scales.stride(0), part.stride(0) if split > 1 else 0, part.stride(-2),
        BITS=bits, HAS_ZEROS=zeros is not None, HAS_GROUP_IDS=group_ids is not None, TILE_GROUPS=tile_groups,
        HAS_BIAS=bias is not None, IS_PARTIAL=split > 1, USE_PDL=pdl, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=warps, num_stages=stages, launch_pdl=pdl)
    if split > 1:
        _split_k_reduce_kernel[(triton.cdiv(n, 1024), m)](
            part, bias if bias is not None else scales, y, n, part.stride(0), part.stride(1), y.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=split, USE_PDL=pdl, BLOCK=1024, launch_pdl=pdl)
    return y
