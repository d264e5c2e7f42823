"""Triton kernel: GEMM y = x @ W^T (+ bias) with W in llama.cpp's quantized blocks, decoded inside the main loop.

x [M, K] bf16/fp16; W [N, row bytes] uint8, each row its blocks along K as gpu/quant/gguf_blocks.py describes
(Q4_0, Q4_1, Q5_0, Q8_0 in blocks of 32 weights; Q4_K, Q5_K, Q6_K in super-blocks of 256). Each element of a
[BLOCK_N, BLOCK_K] weight tile is decoded from its block's bytes (its level's bits, its block's fp16 scales and the
K-quants' 6-bit sub-block scales; the bytes of one block are shared by many elements and come from L1), rounded to
x's dtype and multiplied on the tensor cores (float32 sums). A decode step reads the file's bytes: 4.5 bits per
weight for Q4_K.

Grid and split-K as gpu/kernels/fp8_gemm.py's; BLOCK_K is one super-block (256), which every type's blocks divide.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.fp8_gemm import quant_gemm_tiles
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.skinny_gemm import _split_k_reduce_kernel  # one reduce kernel for every split-K GEMM here
from gpu.quant.gguf_blocks import BLOCK_SIZES, TYPE_SIZES

TYPE_IDS = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2, "Q8_0": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6}
BLOCK_K = 256


@triton.jit
def _byte(ptrs):
    return tl.load(ptrs).to(tl.int32)


@triton.jit
def _half(ptrs):
    """The little-endian fp16 at ptrs, as float32."""
    bits = tl.load(ptrs).to(tl.uint16) | (tl.load(ptrs + 1).to(tl.uint16) << 8)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_scale_min(block, sub):
    """Q4_K/Q5_K: sub-block `sub`'s 6-bit (scale, min) from the 12 bytes at block + 4."""
    low = sub < 4
    first = _byte(block + 4 + tl.where(low, sub, sub + 4))
    second = _byte(block + 4 + tl.where(low, sub + 4, sub - 4))
    third = _byte(block + 4 + sub)
    scale = tl.where(low, first & 63, (first & 15) | ((second >> 6) << 4))
    minimum = tl.where(low, second & 63, (first >> 4) | ((third >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _decode(block, j, TYPE: tl.constexpr):
    """Weight j of the block at byte pointer `block` (both [BLOCK_N, BLOCK_K]), as float32."""
    if TYPE == 0 or TYPE == 1 or TYPE == 2:  # Q4_0, Q4_1, Q5_0: 16 bytes of nibbles after the header
        header = 2 if TYPE == 0 else 4 if TYPE == 1 else 6
        q = (_byte(block + header + (j % 16)) >> ((j // 16) * 4)) & 15
        d = _half(block)
        if TYPE == 0:
            w = (q - 8).to(tl.float32) * d
        elif TYPE == 1:
            w = q.to(tl.float32) * d + _half(block + 2)
        else:
            fifth = (_byte(block + 2 + j // 8) >> (j % 8)) & 1
            w = ((q | (fifth << 4)) - 16).to(tl.float32) * d
    elif TYPE == 3:  # Q8_0
        w = tl.load(block + 2 + j).to(tl.int8, bitcast=True).to(tl.float32) * _half(block)
    elif TYPE == 4 or TYPE == 5:  # Q4_K, Q5_K
        chunk, lane, high = j // 64, j % 32, (j % 64) // 32
        qs = 16 if TYPE == 4 else 48
        q = (_byte(block + qs + chunk * 32 + lane) >> (high * 4)) & 15
        if TYPE == 5:
            q = q | (((_byte(block + 16 + lane) >> (2 * chunk + high)) & 1) << 4)
        scale, minimum = _k_scale_min(block, j // 32)
        w = _half(block) * scale * q.to(tl.float32) - _half(block + 2) * minimum
    else:  # Q6_K
        half, rest = j // 128, j % 128
        quarter, lane = rest // 32, rest % 32
        low = (_byte(block + 64 * half + lane + 32 * (quarter % 2)) >> (4 * (quarter // 2))) & 15
        high = (_byte(block + 128 + 32 * half + lane) >> (2 * quarter)) & 3
        scale = tl.load(block + 192 + 8 * half + 2 * quarter + lane // 16).to(tl.int8, bitcast=True)
        w = _half(block + 208) * scale.to(tl.float32) * ((low | (high << 4)) - 32).to(tl.float32)
    return w


@triton.jit(do_not_specialize=["M", "N"])
def _gguf_gemm_kernel(
    x_ptr, q_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_qn, stride_os, stride_om,
    TYPE: tl.constexpr, BLOCK_SIZE: tl.constexpr, TYPE_SIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_PARTIAL: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pdl_start(USE_PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    j = (offs_k % BLOCK_SIZE)[None, :]
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + offs_k
        x = tl.load(x_ptr + rows_x[:, None] * stride_xm + ks[None, :], mask=(ks < k_end)[None, :], other=0.0)
        blocks = tl.minimum(ks, K - 1) // BLOCK_SIZE  # past the end: the last block, multiplied by x's zeros
        block = q_ptr + rows_w[:, None] * stride_qn + (blocks * TYPE_SIZE)[None, :]
        w = _decode(block, j, TYPE).to(x_ptr.dtype.element_ty)
        acc = tl.dot(x, tl.trans(w), acc)
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if IS_PARTIAL:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def gguf_gemm(x: torch.Tensor, blocks: torch.Tensor, gguf_type: str, bias: torch.Tensor | None = None,
              use_pdl: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:  # [M, K] x [N, bytes] -> [M, N]
    """x @ dequantized(blocks).T (+ bias); `out` (an [M, N] view with unit stride along N) receives it."""
    m, k = x.shape
    n = blocks.shape[0]
    if blocks.dtype != torch.uint8 or blocks.shape[1] != k // BLOCK_SIZES[gguf_type] * TYPE_SIZES[gguf_type] \
            or k % BLOCK_SIZES[gguf_type] or x.stride(1) != 1 or blocks.stride(1) != 1:
        raise ValueError(f"x [M, K] and [N, row bytes] uint8 blocks of {gguf_type} expected, got {tuple(x.shape)} "
                         f"and {blocks.dtype} {tuple(blocks.shape)}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0:
        return y
    block_m, block_n, split, warps, stages = quant_gemm_tiles(m, n, k, BLOCK_K, x.device)
    block_n = min(block_n, 64)  # a decoded tile is computed element by element: keep it in registers
    k_per_split = triton.cdiv(triton.cdiv(k, split), BLOCK_K) * BLOCK_K
    split = triton.cdiv(k, k_per_split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else y
    pdl = uses_pdl(use_pdl, x)
    _gguf_gemm_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)](
        x, blocks, bias if bias is not None else x, part, m, n, k, k_per_split,
        x.stride(0), blocks.stride(0), part.stride(0) if split > 1 else 0, part.stride(-2),
        TYPE=TYPE_IDS[gguf_type], BLOCK_SIZE=BLOCK_SIZES[gguf_type], TYPE_SIZE=TYPE_SIZES[gguf_type],
        HAS_BIAS=bias is not None, IS_PARTIAL=split > 1, USE_PDL=pdl, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=BLOCK_K, num_warps=warps, num_stages=stages, launch_pdl=pdl)
    if split > 1:
        _split_k_reduce_kernel[(triton.cdiv(n, 1024), m)](
            part, bias if bias is not None else x, y, n, part.stride(0), part.stride(1), y.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=split, USE_PDL=pdl, BLOCK=1024, launch_pdl=pdl)
    return y
