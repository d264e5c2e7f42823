"""Triton kernels: activations quantized to FP8 for cuBLAS's scaled GEMM (torch._scaled_mm), from x [M, K] as it
is, or as the kernel that computes x (a residual add + RMSNorm, or a gated activation) writes it.

Per token and group of GROUP columns (the scales cuBLAS's 1x128 block recipe reads: [M, K / GROUP], laid out
M-major as it requires, M padded by zero rows to a multiple of SCALE_ROWS_MULTIPLE), per token (a scale per row over
all of K: its row-wise recipe), or with a static scale (written once per row, so the row-wise recipe takes it). Each
scale is the group's largest magnitude / 448, as gpu/kernels/fp8_gemm.py quantizes in its loop. The fused kernels
quantize the value the norm or activation kernel would have written, rounded to the model dtype as it rounds, so
their FP8 tensor and scales equal that kernel's output quantized by `quantize_rows`, bit for bit: a norm or
activation whose output only a scaled GEMM reads leaves the chip once, in FP8, and skips a launch.
"""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.rms_norm import check_norm_inputs, norm_warps, normed_row
from gpu.kernels.silu_and_mul import check_gated_input, gated_chunk
from gpu.kernels.triton_math import maximum

FP8_MAX = tl.constexpr(448.0)
MIN_SCALE = tl.constexpr(1e-12)
BLOCK = 1024
# cuBLAS takes 1x128 activation scales only with a 16-byte aligned leading dimension (4 float32 rows), and torch
# requires that leading dimension to be the row count: grouped activations are padded to whole sets of 4 rows.
SCALE_ROWS_MULTIPLE = 4


@triton.jit
def _scale_of(amax):
    return tl.maximum(amax / FP8_MAX, MIN_SCALE)


@triton.jit
def _row_scale(s_row, in_scale_ptr, amax, PER_TOKEN: tl.constexpr, STATIC: tl.constexpr):
    """The row's one scale, stored at s_row: the static one, or its largest magnitude's (`amax`, read only PER_TOKEN);
    1.0, stored nowhere, where each group has its own."""
    if STATIC:
        scale = tl.load(in_scale_ptr)
    elif PER_TOKEN:
        scale = _scale_of(amax)
    else:
        scale = 1.0
    if STATIC or PER_TOKEN:
        tl.store(s_row, scale)
    return scale


@triton.jit
def _quantize_chunk(q_row, s_row, x, first_col, K, stride_sg, scale, GROUP: tl.constexpr, PER_ROW: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Stores x [BLOCK] (float32; columns first_col..) as FP8 into q_row, divided by the row's `scale` (PER_ROW) or
    by its groups' own scales, which go to s_row (every stride_sg) as the group ids say."""
    ks = first_col + tl.arange(0, BLOCK)
    if PER_ROW:
        q = x / scale
    else:
        groups = tl.reshape(x, (BLOCK // GROUP, GROUP))
        scales = _scale_of(tl.reduce(tl.abs(groups), 1, maximum))
        q = tl.reshape(groups / scales[:, None], (BLOCK,))
        group_ids = first_col // GROUP + tl.arange(0, BLOCK // GROUP)
        tl.store(s_row + group_ids * stride_sg, scales, mask=group_ids * GROUP < K)
    tl.store(q_row + ks, tl.clamp(q, -FP8_MAX, FP8_MAX).to(tl.float8e4nv), mask=ks < K)


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
    amax = 0.0
    if PER_TOKEN:
        amax = _row_amax(x_row, K, BLOCK)
    scale = _row_scale(s_ptr + row * stride_sm, in_scale_ptr, amax, PER_TOKEN, STATIC)
    for k in range(0, K, BLOCK):
        ks = k + tl.arange(0, BLOCK)
        x = tl.load(x_row + ks, mask=ks < x_columns, other=0.0).to(tl.float32)
        _quantize_chunk(q_ptr + row * stride_qm, s_ptr + row * stride_sm, x, k, K, stride_sg, scale, GROUP,
                        STATIC or PER_TOKEN, BLOCK)


@triton.jit
def _rms_norm_quantize_kernel(
    x_ptr, residual_ptr, weight_ptr, sum_ptr, q_ptr, s_ptr, in_scale_ptr, M, x_stride, residual_stride, eps,
    stride_qm, stride_sm, stride_sg,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, WEIGHT_OFFSET: tl.constexpr,
    SCALES_IN_FLOAT32: tl.constexpr, GROUP: tl.constexpr, PER_TOKEN: tl.constexpr, STATIC: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per row (padded rows included): the row's norm, whole in registers, then its FP8 form."""
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    columns = tl.where(row < M, HIDDEN, 0)  # rows past x's pad the grouped layout, as in _quantize_rows_kernel
    normed = normed_row(x_ptr, residual_ptr, weight_ptr, sum_ptr, row, columns, x_stride, residual_stride, eps,
                        x_ptr.dtype.element_ty, HIDDEN, BLOCK, HAS_RESIDUAL, WEIGHT_OFFSET,
                        SCALES_IN_FLOAT32).to(tl.float32)
    scale = _row_scale(s_ptr + row * stride_sm, in_scale_ptr, tl.reduce(tl.abs(normed), 0, maximum), PER_TOKEN,
                       STATIC)
    _quantize_chunk(q_ptr + row * stride_qm, s_ptr + row * stride_sm, normed, 0, HIDDEN, stride_sg, scale, GROUP,
                    STATIC or PER_TOKEN, BLOCK)


@triton.jit
def _gated_quantize_kernel(
    x_ptr, q_ptr, s_ptr, in_scale_ptr, M, x_stride, stride_qm, stride_sm, stride_sg,
    INTERMEDIATE: tl.constexpr, BLOCK: tl.constexpr, IS_GELU_TANH: tl.constexpr, GROUP: tl.constexpr,
    PER_TOKEN: tl.constexpr, STATIC: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Grid (row, block of columns) for group scales, each block on its own; (row, 1) for a row's scale, which walks
    the row twice (its largest magnitude first) rather than hold it."""
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    q_row = q_ptr + row * stride_qm
    s_row = s_ptr + row * stride_sm
    dtype = x_ptr.dtype.element_ty
    columns = tl.where(row < M, INTERMEDIATE, 0)  # rows past x's pad the grouped layout
    if STATIC or PER_TOKEN:
        amax = 0.0
        if PER_TOKEN:
            amaxes = tl.full((BLOCK,), 0.0, tl.float32)
            for k in range(0, INTERMEDIATE, BLOCK):
                cols = k + tl.arange(0, BLOCK)
                chunk = gated_chunk(x_row, cols, cols < columns, INTERMEDIATE, IS_GELU_TANH, dtype)
                amaxes = tl.maximum(amaxes, tl.abs(chunk.to(tl.float32)))
            amax = tl.reduce(amaxes, 0, maximum)
        scale = _row_scale(s_row, in_scale_ptr, amax, PER_TOKEN, STATIC)
        for k in range(0, INTERMEDIATE, BLOCK):
            cols = k + tl.arange(0, BLOCK)
            chunk = gated_chunk(x_row, cols, cols < columns, INTERMEDIATE, IS_GELU_TANH, dtype)
            _quantize_chunk(q_row, s_row, chunk.to(tl.float32), k, INTERMEDIATE, stride_sg, scale, GROUP, True, BLOCK)
    else:
        first_col = tl.program_id(1) * BLOCK
        cols = first_col + tl.arange(0, BLOCK)
        chunk = gated_chunk(x_row, cols, cols < columns, INTERMEDIATE, IS_GELU_TANH, dtype)
        _quantize_chunk(q_row, s_row, chunk.to(tl.float32), first_col, INTERMEDIATE, stride_sg, 1.0, GROUP, False,
                        BLOCK)


def _allocate(m: int, k: int, group: int | None, input_scale: torch.Tensor | None,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """(the FP8 tensor, its scales, the rows both hold, whether scales are per group) as `quantize_rows` returns
    them."""
    is_grouped = group is not None and input_scale is None
    rows = -(-m // SCALE_ROWS_MULTIPLE) * SCALE_ROWS_MULTIPLE if is_grouped else m
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=device)
    scales = (torch.empty((k // group, rows), dtype=torch.float32, device=device).t() if is_grouped  # type: ignore[operator]
              else torch.empty((m, 1), dtype=torch.float32, device=device))
    return q, scales, rows, is_grouped


def _check_group(k: int, group: int | None, block: int) -> None:
    if group is not None and (block % group or k % group):
        raise ValueError(f"{k} columns in groups of {group} (and tiles of {block}) expected")


def quantize_rows(x: torch.Tensor, group: int | None, input_scale: torch.Tensor | None = None,
                  use_pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(x as FP8 [M, K], its float32 scales): per token group of `group` columns ([M, K / group], M-major, both with
    M rounded up to SCALE_ROWS_MULTIPLE by zero rows), per token (group None: [M, 1]) or the static `input_scale`
    ([M, 1], every row the same)."""
    m, k = x.shape
    if x.stride(1) != 1:
        raise ValueError(f"x [M, K] with unit stride along K expected, got {tuple(x.shape)} strides {x.stride()}")
    _check_group(k, group, BLOCK)
    q, scales, rows, is_grouped = _allocate(m, k, group, input_scale, x.device)
    if m == 0:
        return q, scales
    pdl = uses_pdl(use_pdl, x)
    _quantize_rows_kernel[(rows,)](
        x, q, scales, input_scale if input_scale is not None else scales, m, k, x.stride(0), q.stride(0),
        scales.stride(0), scales.stride(1), GROUP=group if is_grouped else BLOCK,
        PER_TOKEN=group is None and input_scale is None, STATIC=input_scale is not None, USE_PDL=pdl, BLOCK=BLOCK,
        launch_pdl=pdl)
    return q, scales


def rms_norm_quantized(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None,
    group: int | None,
    input_scale: torch.Tensor | None = None,
    weight_offset: float = 0.0,
    scales_in_float32: bool = False,
    use_pdl: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(quantize_rows(norm(x + residual), group, input_scale)..., x + residual): gpu/kernels/rms_norm.py's norm,
    quantized in the same kernel."""
    check_norm_inputs(x, weight, residual)
    m, hidden = x.shape
    block = triton.next_power_of_2(hidden)
    _check_group(hidden, group, block)
    q, scales, rows, is_grouped = _allocate(m, hidden, group, input_scale, x.device)
    summed = torch.empty_like(x) if residual is not None else x
    if m == 0:
        return q, scales, summed
    pdl = uses_pdl(use_pdl, x)
    _rms_norm_quantize_kernel[(rows,)](
        x, residual if residual is not None else x, weight, summed, q, scales,
        input_scale if input_scale is not None else scales, m, x.stride(0),
        residual.stride(0) if residual is not None else 0, eps, q.stride(0), scales.stride(0), scales.stride(1),
        HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None, WEIGHT_OFFSET=weight_offset,
        SCALES_IN_FLOAT32=scales_in_float32, GROUP=group if is_grouped else block,
        PER_TOKEN=group is None and input_scale is None, STATIC=input_scale is not None, USE_PDL=pdl,
        launch_pdl=pdl, num_warps=norm_warps(block),
        enable_fp_fusion=False,  # rounded as the norm kernel rounds
    )
    return q, scales, summed


def gated_activation_quantized(x: torch.Tensor, activation: str, group: int | None,
                               input_scale: torch.Tensor | None = None,
                               use_pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows(act(x[:, :I]) * x[:, I:], group, input_scale): gpu/kernels/silu_and_mul.py's activation,
    quantized in the same kernel."""
    check_gated_input(x, activation)
    m, intermediate = x.shape[0], x.shape[1] // 2
    _check_group(intermediate, group, BLOCK)
    q, scales, rows, is_grouped = _allocate(m, intermediate, group, input_scale, x.device)
    if m == 0 or intermediate == 0:
        return q, scales
    pdl = uses_pdl(use_pdl, x)
    column_blocks = triton.cdiv(intermediate, BLOCK) if is_grouped else 1
    _gated_quantize_kernel[(rows, column_blocks)](
        x, q, scales, input_scale if input_scale is not None else scales, m, x.stride(0), q.stride(0),
        scales.stride(0), scales.stride(1),
        INTERMEDIATE=intermediate, BLOCK=BLOCK, IS_GELU_TANH=activation == "gelu_tanh",
        GROUP=group if is_grouped else BLOCK, PER_TOKEN=group is None and input_scale is None,
        STATIC=input_scale is not None, USE_PDL=pdl, launch_pdl=pdl, num_warps=4,
        enable_fp_fusion=False,  # rounded as the activation kernel rounds
    )
    return q, scales
