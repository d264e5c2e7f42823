"""Triton kernel: W8A8 FP8 GEMM y = x @ W^T (+ bias), the activations quantized to FP8 inside the main loop.

x [M, K] bf16/fp16; W [N, K] float8_e4m3fn with float32 scales, one per block of (SCALE_ROWS, GROUP) weights
(scales [ceil(N / SCALE_ROWS), ceil(K / GROUP)]: DeepSeek's and Qwen's 128x128 blocks) or one per row (scales
[N, 1]: per-channel and per-tensor checkpoints). Activations are quantized per token and group of GROUP columns
(the weight blocks' columns; 128 for per-row weights), each group's scale its largest magnitude / 448, or with the
checkpoint's static scale. Each group's FP8 product runs on the tensor cores (float32 sums) and is scaled by its
activation and weight scales in float32: quantizing in the loop needs no kernel (and no round trip through memory)
before the product. A group per token is finer than a per-token scale, so a per-channel checkpoint's product is at
least as close to the unquantized one as its calibration assumed.

The weight tile is the tensor cores' M side and the rows of x their N side (padded to 16), so at a decode step's
few rows no weight byte is wasted; split-K slices (gpu/kernels/quant_gemm_configs.py) keep the GPU full, their
float32 partial sums added by the skinny GEMM's reduce kernel in a fixed order. Rows past M and N re-read the last
valid row, never stored. No data-dependent control: CUDA-graph capturable.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.device_tables import device_name
from gpu.kernels.fp8_row_gemv import fp8_row_gemv, takes_fp8_row_gemv
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.quant_gemm_configs import GemvTiles, Tiles, quant_tiles, runs_row_gemv, table_for
from gpu.kernels.quant_gemv import fp8_gemv
from gpu.kernels.skinny_gemm import _split_k_reduce_kernel, _store_tile  # one epilogue for every split-K GEMM here
from gpu.kernels.triton_math import maximum

FP8_MAX = tl.constexpr(448.0)
MIN_SCALE = tl.constexpr(1e-12)  # a group of zeros quantizes with this scale (to zeros), never divides by zero
ACTIVATION_GROUP = 128  # activation columns per scale for per-row weights
GROUPS = (32, 64, 128, 256)  # scale block widths the kernel takes (the FP8 MMA's K is 32)


@triton.jit
def _quantize(x, scale):
    """x / scale as FP8, clamped to its range."""
    return tl.clamp(x / scale, -FP8_MAX, FP8_MAX).to(tl.float8e4nv)


@triton.jit(do_not_specialize=["M", "N"])
def _fp8_gemm_kernel(
    x_ptr, w_ptr, ws_ptr, in_scale_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_wsn, stride_os, stride_om,
    SCALE_ROWS: tl.constexpr, BLOCK_SCALES: tl.constexpr, STATIC: tl.constexpr, GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_PARTIAL: tl.constexpr, EVEN_K: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pdl_start(USE_PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_g = tl.arange(0, GROUP)
    rows_x = tl.minimum(offs_m, M - 1)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_ptrs = w_ptr + rows_w[:, None] * stride_wn + (k_start + offs_g)[None, :]  # [BLOCK_N, GROUP]
    x_ptrs = x_ptr + rows_x[:, None] * stride_xm + (k_start + offs_g)[None, :]  # [BLOCK_M, GROUP]
    ws_rows = ws_ptr + (rows_w // SCALE_ROWS) * stride_wsn
    if STATIC:
        x_scale = tl.load(in_scale_ptr)
    acc = tl.full((BLOCK_N, BLOCK_M), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        for g in tl.static_range(BLOCK_K // GROUP):
            if EVEN_K:
                w = tl.load(w_ptrs + g * GROUP)
                x = tl.load(x_ptrs + g * GROUP).to(tl.float32)
            else:
                in_k = (k + g * GROUP + offs_g < k_end)[None, :]
                w = tl.load(w_ptrs + g * GROUP, mask=in_k, other=0.0)
                x = tl.load(x_ptrs + g * GROUP, mask=in_k, other=0.0).to(tl.float32)
            if STATIC:
                part = tl.dot(w, tl.trans(_quantize(x, x_scale)))
            else:
                group_scale = tl.maximum(tl.reduce(tl.abs(x), 1, maximum) / FP8_MAX, MIN_SCALE)  # [BLOCK_M]
                part = tl.dot(w, tl.trans(_quantize(x, group_scale[:, None]))) * group_scale[None, :]
            if BLOCK_SCALES:  # the weights' block of these columns (the last one past K's end: zeros multiply it)
                part *= tl.load(ws_rows + tl.minimum(k + g * GROUP, K - 1) // GROUP)[:, None]
            acc += part
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if not BLOCK_SCALES:
        acc *= tl.load(ws_rows)[:, None]
    if STATIC:
        acc *= x_scale
    _store_tile(tl.trans(acc), bias_ptr, out_ptr, offs_m, offs_n, pid_k, M, N, stride_os, stride_om, HAS_BIAS,
                IS_PARTIAL)


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor, scale_block: tuple[int, int],
             input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, use_pdl: bool = True,
             out: torch.Tensor | None = None, tiles: Tiles | None = None
             ) -> torch.Tensor:  # [M, K] x [N, K] -> [M, N]
    """x @ dequantized(weight).T (+ bias): weight_scales [ceil(N / rows), ceil(K / columns)] for a `scale_block` of
    (rows, columns), or [N, 1] for (1, K): a scale per row. Activations quantized per token group, or by
    `input_scale` (static); on the GEMV path (`tiles`, else quant_tiles' choice) they stay in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.dtype != torch.float8_e4m3fn or weight.shape[1] != k or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"x [M, K] and an FP8 weight [N, K] with unit stride along K expected, got {x.dtype} "
                         f"{tuple(x.shape)} and {weight.dtype} {tuple(weight.shape)}")
    scale_rows, scale_cols = scale_block
    is_per_row = scale_cols >= k and scale_rows == 1
    if weight_scales.shape != (triton.cdiv(n, scale_rows), triton.cdiv(k, scale_cols)) or not (
            is_per_row or scale_cols in GROUPS):
        raise ValueError(f"scales {tuple(weight_scales.shape)} of [{n}, {k}] in blocks of {scale_block}: block "
                         f"columns must be one of {GROUPS}, or one scale per row")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0:
        return y
    t = tiles or quant_tiles(m, n, k, "fp8", num_sms(x.device), table_for(device_name(x.device)))
    if isinstance(t, GemvTiles):
        group = None if is_per_row else scale_cols
        gemv = fp8_row_gemv if runs_row_gemv(t) and takes_fp8_row_gemv(x, weight, group) else fp8_gemv
        gemv(x, weight, weight_scales, scale_rows, group, bias, y, t, uses_pdl(use_pdl, x))
        return y
    group = ACTIVATION_GROUP if is_per_row else scale_cols
    block_k = max(t.block_k, group)
    k_per_split = triton.cdiv(triton.cdiv(k, t.split_k), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else y
    pdl = uses_pdl(use_pdl, x)
    _fp8_gemm_kernel[(triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), split)](
        x, weight, weight_scales, input_scale if input_scale is not None else weight_scales,
        bias if bias is not None else weight_scales, part,
        m, n, k, k_per_split, x.stride(0), weight.stride(0), weight_scales.stride(0),
        part.stride(0) if split > 1 else 0, part.stride(-2),
        SCALE_ROWS=scale_rows, BLOCK_SCALES=not is_per_row, STATIC=input_scale is not None, GROUP=group,
        HAS_BIAS=bias is not None, IS_PARTIAL=split > 1, EVEN_K=k % k_per_split == 0 and k_per_split % block_k == 0,
        USE_PDL=pdl, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=block_k, num_warps=t.num_warps,
        num_stages=t.num_stages, launch_pdl=pdl)
    if split > 1:
        reduce_split_k(part, bias, y, pdl)
    return y


def reduce_split_k(part: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, pdl: bool) -> None:
    """y = sum of the K slices' partial sums [split, M, N] (+ bias), in a fixed order."""
    split, m, n = part.shape
    _split_k_reduce_kernel[(triton.cdiv(n, 1024), m)](
        part, bias if bias is not None else part, y, n, part.stride(0), part.stride(1), y.stride(0),
        HAS_BIAS=bias is not None, SPLIT_K=split, USE_PDL=pdl, BLOCK=1024, launch_pdl=pdl)


_SMS: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's interpreter: the tile rule's default count
        from gpu.kernels.quant_gemm_configs import NUM_SMS_DEFAULT

        return NUM_SMS_DEFAULT
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]
