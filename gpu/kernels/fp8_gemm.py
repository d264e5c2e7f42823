"""Triton kernel: W8A8 FP8 GEMM y = x @ W^T (+ bias) with the activations quantized inside the main loop.

x [M, K] bf16/fp16; W [N, K] float8_e4m3fn with float32 scales per block of (SCALE_ROWS, SCALE_COLS) weights,
scales [ceil(N / SCALE_ROWS), ceil(K / SCALE_COLS)] (one per row: SCALE_COLS = K). Activations become FP8 as the
checkpoint's scheme says: per token group of BLOCK_K columns (block-scaled weights, BLOCK_K = SCALE_COLS: each
group's largest magnitude / 448), per token (the row's largest magnitude over all of K, found in a first pass over
x), or with a static scale. Each tile's FP8 product runs on the tensor cores (float32 sums) and is scaled by its
activation and weight scales; quantizing in the loop saves the separate quantization kernel and its round trip
through memory, and gives exactly the values that kernel would (the same rounding per element).

Grid: (tiles of BLOCK_M rows, blocks of BLOCK_N columns, SPLIT_K slices of K); with SPLIT_K > 1 partial sums go to a
float32 workspace that the skinny GEMM's reduce kernel adds in a fixed order. No data-dependent control: CUDA-graph
capturable.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.skinny_gemm import _split_k_reduce_kernel  # one reduce kernel for every split-K GEMM here

FP8_MAX = tl.constexpr(448.0)
MIN_SCALE = tl.constexpr(1e-12)  # a row of zeros quantizes with this scale (to zeros), never divides by zero
PER_TOKEN = tl.constexpr(0)
PER_GROUP = tl.constexpr(1)
STATIC = tl.constexpr(2)
ACTIVATION_SCHEMES = {"per_token": 0, "per_group": 1, "static": 2}


@triton.jit
def _quantize(x, scale):
    """x / scale as FP8, clamped to its range."""
    return tl.clamp(x / scale, -FP8_MAX, FP8_MAX).to(tl.float8e4nv)


@triton.jit(do_not_specialize=["M", "N"])
def _fp8_gemm_kernel(
    x_ptr, w_ptr, ws_ptr, in_scale_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_wsn, stride_os, stride_om,
    SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr, ACT: tl.constexpr,
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
    if ACT == PER_TOKEN:  # the row's scale from all of K
        amax = tl.full((BLOCK_M,), 0.0, tl.float32)
        for k in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + rows_x[:, None] * stride_xm + (k + offs_k)[None, :],
                        mask=(k + offs_k)[None, :] < K, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
        x_scale = tl.maximum(amax / FP8_MAX, MIN_SCALE)
    elif ACT == STATIC:
        x_scale = tl.full((BLOCK_M,), 1.0, tl.float32) * tl.load(in_scale_ptr)
    else:
        x_scale = tl.full((BLOCK_M,), 1.0, tl.float32)
    ws_rows = ws_ptr + (rows_w // SCALE_ROWS) * stride_wsn
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_mask = (k + offs_k) < k_end
        x = tl.load(x_ptr + rows_x[:, None] * stride_xm + (k + offs_k)[None, :], mask=k_mask[None, :],
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows_w[:, None] * stride_wn + (k + offs_k)[None, :], mask=k_mask[None, :], other=0.0)
        w_scale = tl.load(ws_rows + k // SCALE_COLS)  # [BLOCK_N]: a tile lies within one scale column
        if ACT == PER_GROUP:
            group_scale = tl.maximum(tl.max(tl.abs(x), axis=1) / FP8_MAX, MIN_SCALE)
            part = tl.dot(_quantize(x, group_scale[:, None]), tl.trans(w))
            acc += part * group_scale[:, None] * w_scale[None, :]
        else:
            acc += tl.dot(_quantize(x, x_scale[:, None]), tl.trans(w)) * w_scale[None, :]
    if ACT != PER_GROUP:
        acc *= x_scale[:, None]
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if IS_PARTIAL:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def quant_gemm_tiles(m: int, n: int, k: int, block_k: int, device: torch.device) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, num_warps, num_stages) of this module's and the other quantized GEMMs: few rows
    stream W over split K slices enough to fill the GPU; many rows take large tiles."""
    num_sms = _num_sms(device)
    if m <= 16:
        block_m, block_n, warps, stages = 16, 64, 4, 4
    elif m <= 64:
        block_m, block_n, warps, stages = 64, 64, 4, 4
    else:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = max(1, min(triton.cdiv(2 * num_sms, tiles), k // (4 * block_k)))
    return block_m, block_n, split, warps, stages


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor, scale_block: tuple[int, int],
             input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
             use_pdl: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:  # [M, K] x [N, K] -> [M, N]
    """x @ dequantized(weight).T (+ bias): activations quantized per token group of the scale block's columns
    (block scales), per token (a scale per row), or by `input_scale` (static) where given."""
    m, k = x.shape
    n = weight.shape[0]
    scale_rows, scale_cols = scale_block
    if weight.dtype != torch.float8_e4m3fn or weight.shape[1] != k or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"x [M, K] and an FP8 weight [N, K] with unit stride along K expected, got {x.dtype} "
                         f"{tuple(x.shape)} and {weight.dtype} {tuple(weight.shape)}")
    if weight_scales.shape != (triton.cdiv(n, scale_rows), triton.cdiv(k, scale_cols)):
        raise ValueError(f"scales {tuple(weight_scales.shape)} do not match blocks {scale_block} of [{n}, {k}]")
    is_per_row = scale_cols >= k
    act = "static" if input_scale is not None else ("per_token" if is_per_row else "per_group")
    block_k = 128 if is_per_row else scale_cols
    if block_k not in (32, 64, 128, 256):
        raise ValueError(f"block scales of {scale_cols} columns are not supported (32, 64, 128 or 256)")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0:
        return y
    block_m, block_n, split, warps, stages = quant_gemm_tiles(m, n, k, block_k, x.device)
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else y
    pdl = uses_pdl(use_pdl, x)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _fp8_gemm_kernel[grid](
        x, weight, weight_scales, input_scale if input_scale is not None else weight_scales,
        bias if bias is not None else weight_scales, part,
        m, n, k, k_per_split, x.stride(0), weight.stride(0), weight_scales.stride(0),
        part.stride(0) if split > 1 else 0, part.stride(-2),
        SCALE_ROWS=scale_rows, SCALE_COLS=scale_cols if not is_per_row else max(k, 1),
        ACT=ACTIVATION_SCHEMES[act], HAS_BIAS=bias is not None, IS_PARTIAL=split > 1, USE_PDL=pdl,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages, launch_pdl=pdl)
    if split > 1:
        block = 1024
        _split_k_reduce_kernel[(triton.cdiv(n, block), m)](
            part, bias if bias is not None else weight_scales, y, n, part.stride(0), part.stride(1), y.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=split,
            USE_PDL=pdl, BLOCK=block, launch_pdl=pdl)
    return y


_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's interpreter: an H100's count, so the tiles are those a GPU would run
        return 132
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]
