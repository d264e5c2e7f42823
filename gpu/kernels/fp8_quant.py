"""Triton kernel: activations x [M, K] quantized to FP8 for cuBLAS's scaled GEMM (torch._scaled_mm).

Per token and group of GROUP columns (the scales cuBLAS's 1x128 block recipe reads: [M, K / GROUP], laid out
M-major as it requires, M padded by zero rows to a multiple of SCALE_ROWS_MULTIPLE), per token (a scale per row over
all of K: its row-wise recipe), or with a static scale (written once per row, so the row-wise recipe takes it). Each
scale is the group's largest magnitude / 448, as gpu/kernels/fp8_gemm.py quantizes in its loop. Grouped and static
scales need nothing from the rest of the row: a program quantizes one BLOCK of columns of one row, so a step's few
hundred rows still make thousands of programs (one program a row walking its columns leaves the GPU waiting on each
chunk's loads). Per-token scales take the whole row's largest magnitude first: one program a row, in chunks.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import maximum

FP8_MAX = tl.constexpr(448.0)
MIN_SCALE = tl.constexpr(1e-12)
BLOCK = 1024
# cuBLAS takes 1x128 activation scales only with a 16-byte aligned leading dimension (4 float32 rows), and torch
# requires that leading dimension to be the row count: grouped activations are padded to whole sets of 4 rows.
SCALE_ROWS_MULTIPLE = 4


@triton.jit
def _row_amax(x_row, K, BLOCK: tl.constexpr):
    amax = tl.full((BLOCK,), 0.0, tl.float32)
    for k in range(0, K, BLOCK):
        ks = k + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)))
    return tl.reduce(amax, 0, maximum)


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, in_scale_ptr, M, K, stride_xm, stride_qm, stride_sm, stride_sg,
    GROUP: tl.constexpr, PER_TOKEN: tl.constexpr, STATIC: tl.constexpr, USE_PDL: tl.constexpr, BLOCK: tl.constexpr,
):
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    x_columns = tl.where(row < M, K, 0)  # rows past x's pad the grouped layout: zeros, scaled by MIN_SCALE
    first_column = tl.program_id(1) * BLOCK  # the launch gives per-token rows one program: the whole row
    if STATIC:
        scale = tl.load(in_scale_ptr)
    elif PER_TOKEN:
        scale = tl.maximum(_row_amax(x_row, K, BLOCK) / FP8_MAX, MIN_SCALE)
    if (STATIC or PER_TOKEN) and first_column == 0:
        tl.store(s_ptr + row * stride_sm, scale)
    for k in range(first_column, K if PER_TOKEN else tl.minimum(K, first_column + BLOCK), BLOCK):
        ks = k + tl.arange(0, BLOCK)
        x = tl.load(x_row + ks, mask=ks < x_columns, other=0.0).to(tl.float32)
        if STATIC or PER_TOKEN:
            q = x / scale
        else:
            groups = tl.reshape(x, (BLOCK // GROUP, GROUP))
            scales = tl.maximum(tl.reduce(tl.abs(groups), 1, maximum) / FP8_MAX, MIN_SCALE)
            q = tl.reshape(groups / scales[:, None], (BLOCK,))
            group_ids = k // GROUP + tl.arange(0, BLOCK // GROUP)
            tl.store(s_ptr + row * stride_sm + group_ids * stride_sg, scales, mask=group_ids * GROUP < K)
        tl.store(q_ptr + row * stride_qm + ks, tl.clamp(q, -FP8_MAX, FP8_MAX).to(tl.float8e4nv), mask=ks < K)


def quantize_rows(x: torch.Tensor, group: int | None, input_scale: torch.Tensor | None = None,
                  use_pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(x as FP8 [M, K], its float32 scales): per token group of `group` columns ([M, K / group], M-major, both with
    M rounded up to SCALE_ROWS_MULTIPLE by zero rows), per token (group None: [M, 1]) or the static `input_scale`
    ([M, 1], every row the same)."""
    m, k = x.shape
    if x.stride(1) != 1 or (group is not None and (BLOCK % group or k % group)):
        raise ValueError(f"x [M, K] with unit stride along K and K a multiple of the group {group} expected, got "
                         f"{tuple(x.shape)} strides {x.stride()}")
    is_grouped = group is not None and input_scale is None
    rows = -(-m // SCALE_ROWS_MULTIPLE) * SCALE_ROWS_MULTIPLE if is_grouped else m
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = (torch.empty((k // group, rows), dtype=torch.float32, device=x.device).t() if is_grouped  # type: ignore[operator]
              else torch.empty((m, 1), dtype=torch.float32, device=x.device))
    if m == 0:
        return q, scales
    pdl = uses_pdl(use_pdl, x)
    column_blocks = 1 if group is None and input_scale is None else triton.cdiv(k, BLOCK)
    _quantize_rows_kernel[(rows, column_blocks)](
        x, q, scales, input_scale if input_scale is not None else scales, m, k, x.stride(0), q.stride(0),
        scales.stride(0), scales.stride(1), GROUP=group if is_grouped else BLOCK,
        PER_TOKEN=group is None and input_scale is None, STATIC=input_scale is not None, USE_PDL=pdl, BLOCK=BLOCK,
        launch_pdl=pdl)
    return q, scales
