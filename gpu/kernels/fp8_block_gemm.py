"""Triton kernel: FP8 GEMM y = x @ W^T (+ bias) on activations quantized beforehand (gpu/kernels/fp8_quant.py), for
many rows.

xq [M', K] float8_e4m3fn (M' >= M: the quantizer pads grouped rows) with float32 scales, one per token and group of
GROUP columns (xs [M', K / GROUP], any strides: the quantizer's are M-major) or one per token (xs [M, 1]); W [N, K]
float8_e4m3fn with a scale per block of (SCALE_ROWS, GROUP) weights (ws [ceil(N / SCALE_ROWS), K / GROUP]) or one
per row (ws [N, 1]). The same product as cuBLAS's 1x128 x 128x128 and row-wise recipes (torch._scaled_mm), for the
shapes and GPUs where a Triton kernel measures faster or cuBLAS refuses the layout.

Unlike gpu/kernels/fp8_gemm.py (activations quantized inside the loop, once per weight tile: cheap at a decode step's
few rows, repeated N / BLOCK_N times at many), x is quantized once and each program runs square tensor-core tiles,
rows of x on the MMA's M side. Block scales: each GROUP-column slice's FP8 product (float32 sums) is scaled by its
activation and weight scales before it is added; per-row scales: the whole product is scaled once at the end.
Programs are ordered in groups of GROUP_M row tiles so that neighbours share weight tiles in L2. Tiles come by
pointer loads, or with `use_tma` by the tensor memory accelerator (Hopper; x and W 16-byte aligned), which frees the
warps' issue slots that pointer loads spend. Rows past M and columns past N re-read the last valid row (TMA: read
zeros), never stored. No data-dependent control: CUDA-graph capturable.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.skinny_gemm import _is_tma_aligned


@dataclass(frozen=True)
class BlockGemmTiles:
    block_m: int = 128
    block_n: int = 128
    group_m: int = 8  # row tiles a column of programs walks before the next weight tile
    num_warps: int = 8
    num_stages: int = 4
    use_tma: bool = False


@triton.jit
def _program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of this program: GROUP_M row tiles per weight tile before the next one."""
    pid = tl.program_id(0)
    num_m, num_n = (M + BLOCK_M - 1) // BLOCK_M, (N + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit(do_not_specialize=["M", "N"])
def _fp8_block_gemm_kernel(
    xq_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, x_desc, w_desc,
    M, N, K,
    stride_xm, stride_xsm, stride_xsg, stride_wn, stride_wsn, stride_om,
    SCALE_ROWS: tl.constexpr, BLOCK_SCALES: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
):
    pdl_start(USE_PDL)
    pid_m, pid_n = _program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, GROUP)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_ptrs = xq_ptr + rows_x[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, GROUP]
    w_ptrs = w_ptr + rows_w[:, None] * stride_wn + offs_k[None, :]  # [BLOCK_N, GROUP]
    xs_rows = xs_ptr + rows_x * stride_xsm
    ws_rows = ws_ptr + (rows_w // SCALE_ROWS) * stride_wsn
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(0, K, GROUP):
        if USE_TMA:  # rows, columns and K past their ends read as zeros
            x = x_desc.load([pid_m * BLOCK_M, k])
            w = w_desc.load([pid_n * BLOCK_N, k])
        elif EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            in_k = (k + offs_k < K)[None, :]
            x = tl.load(x_ptrs, mask=in_k, other=0.0)
            w = tl.load(w_ptrs, mask=in_k, other=0.0)
        if BLOCK_SCALES:
            group = k // GROUP
            scale = tl.load(xs_rows + group * stride_xsg)[:, None] * tl.load(ws_rows + group)[None, :]
            acc += tl.dot(x, tl.trans(w)) * scale
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        if not USE_TMA:
            x_ptrs += GROUP
            w_ptrs += GROUP
    if not BLOCK_SCALES:
        acc *= tl.load(xs_rows)[:, None] * tl.load(ws_rows)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows_w).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def fp8_block_gemm(xq: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor, weight_scales: torch.Tensor,
                   scale_block: tuple[int, int], out: torch.Tensor, bias: torch.Tensor | None = None,
                   tiles: BlockGemmTiles = BlockGemmTiles(), use_pdl: bool = True) -> torch.Tensor:
    """out [M, N] = dequantized(xq) @ dequantized(weight).T (+ bias), M = out's rows (xq may hold more). Block
    scales (`scale_block` (rows, 128)) with x_scales [>= M, K / 128]; per-row ((1, K)) with x_scales [M, 1]."""
    m, n = out.shape
    k = xq.shape[1]
    scale_rows, scale_cols = scale_block
    is_per_row = scale_rows == 1 and scale_cols >= k
    group = 128
    expected_ws = (n, 1) if is_per_row else (triton.cdiv(n, scale_rows), k // group)
    if (xq.dtype != torch.float8_e4m3fn or weight.dtype != torch.float8_e4m3fn or weight.shape != (n, k)
            or xq.shape[0] < m or xq.stride(1) != 1 or weight.stride(1) != 1 or weight_scales.shape != expected_ws
            or (not is_per_row and (scale_cols != group or k % group)) or x_scales.shape[0] < m):
        raise ValueError(f"FP8 x {tuple(xq.shape)} and weight {tuple(weight.shape)} (unit stride along K) with scales "
                         f"{tuple(x_scales.shape)}, {tuple(weight_scales.shape)} in blocks of {scale_block} for out "
                         f"{tuple(out.shape)}: block columns must be {group} (K a multiple), or one scale per row")
    if m == 0:
        return out
    pdl = uses_pdl(use_pdl, xq)
    x_desc, w_desc = xq, weight  # unused by the pointer loads
    if tiles.use_tma and _is_tma_aligned(xq) and _is_tma_aligned(weight):
        x_desc = TensorDescriptor.from_tensor(xq, [tiles.block_m, group])
        w_desc = TensorDescriptor.from_tensor(weight, [tiles.block_n, group])
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n),)
    _fp8_block_gemm_kernel[grid](
        xq, x_scales, weight, weight_scales, bias if bias is not None else weight_scales, out, x_desc, w_desc,
        m, n, k, xq.stride(0), x_scales.stride(0), x_scales.stride(1), weight.stride(0), weight_scales.stride(0),
        out.stride(0), SCALE_ROWS=scale_rows, BLOCK_SCALES=not is_per_row, GROUP=group, HAS_BIAS=bias is not None,
        EVEN_K=k % group == 0, USE_TMA=x_desc is not xq, USE_PDL=pdl, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        GROUP_M=tiles.group_m,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl)
    return out
