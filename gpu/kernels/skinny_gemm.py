"""Triton kernel: skinny GEMM y = x @ W^T (+ bias) for 1..256 rows (decode steps, short prefills), reading W once.

x [M, K] with M <= MAX_ROWS, W [N, K] row-major, bias [N] or None; y [M, N] in x's dtype (bf16/fp16), sums in
float32, the bias added in float32 before the one rounding. A decode step is a chain of such products, and at these
sizes cuBLAS pays a fixed cost per call and picks poor kernels for some shapes, where this kernel streams W at a
higher share of the memory bandwidth.

Grid: (tiles of BLOCK_M rows times blocks of BLOCK_N output columns, SPLIT_K slices of K), the row tiles the faster
(one axis: a vocabulary's column blocks pass the second axis' 65,535); the row tiles of one column
block are neighbours in launch order, so the weight tile they share is read from HBM once and from L2 after. Each
program streams its [BLOCK_N, K / SPLIT_K] slice of W in [BLOCK_N, BLOCK_K] tiles of 16-byte loads and multiplies
every tile with its rows of x (x is small and stays in L2). Two inner products: `fma` (float32 products summed over
K; up to 8 rows, one tile, no padding; one row loads x as copies of its row in the weight tile's layout and sums
along K after the loop, so that nothing crosses threads inside it) and `dot` (tensor cores on W tile x x tile^T:
columns are the MMA's M, rows its N, padded to BLOCK_M >= 16). Rows past M and columns past N re-read the last valid
row (no masks on the weight stream); their sums are never stored. A config with `use_tma` runs the dot path in a
second kernel whose tiles the tensor memory accelerator brings (Hopper; zeros past the edges), where x and W are
16-byte aligned. With SPLIT_K > 1 each program writes float32 partial sums to a workspace [SPLIT_K, M, N] and a
second kernel adds them in a fixed order (no atomics: deterministic).

A prologue may make x on the fly, so the elementwise kernel before the product need not run (at a few rows each
launch costs more than its bytes): `skinny_gemm_rms_norm` multiplies norm(x + residual), the residual add and
RMSNorm of gpu/kernels/rms_norm.py rounded at the same points (each program first sums the squares of its rows
over all of K, from L2; the program at column block 0 and K slice 0 also writes x + residual, the next block's
residual stream), and `skinny_gemm_silu_and_mul` multiplies silu(gate) * up of a merged gate/up projection, as
gpu/kernels/silu_and_mul.py rounds it. With a prologue the TMA kernel brings only W's tiles; x's are computed.

Launch parameters come from gpu/kernels/skinny_gemm_configs.py: a table per GPU keyed by (row bucket, N, K), and
rules for other shapes. Nothing depends on the data, and M is no specialization key, so a call is CUDA-graph
capturable and compiles once per row bucket's config. Invariants the wrapper checks: 2-d x and W with unit stride
along K, same dtype. Optional programmatic dependent launch (`use_pdl`, Hopper): the first weight tile is read
before waiting on the kernel that writes x.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gpu.kernels.device_tables import device_name
from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.skinny_gemm_configs import (
    FEW_ROWS,
    MAX_ROWS,
    SkinnyConfig,
    Table,
    prologue_buckets_for,
    row_bucket,
    table_for,
)
from gpu.kernels.skinny_gemm_configs import config_for as table_config_for
from gpu.kernels.skinny_gemm_configs import preferred_config as table_preferred_config
from gpu.kernels.skinny_gemm_configs import prologue_config as rule_prologue_config
from gpu.kernels.triton_math import add

__all__ = ["FEW_ROWS", "MAX_ROWS", "SkinnyConfig", "config_for", "preferred_config", "prologue_config", "row_bucket",
           "skinny_gemm", "skinny_gemm_rms_norm", "skinny_gemm_silu_and_mul"]


NO_PROLOGUE = tl.constexpr(0)
RMS_NORM = tl.constexpr(1)  # x := norm(x + residual) * norm_weight
SILU_AND_MUL = tl.constexpr(2)  # x := silu(x[:, :K]) * x[:, K:]
VECTOR = tl.constexpr(8)  # elements of one 16-byte load of W: the one-row path sums them within their thread


@triton.jit
def _load_along_k(ptrs, k_mask, EVEN_K: tl.constexpr):
    """A tile whose K positions past the end (k_mask false) read as zeros; with EVEN_K there are none, and no mask
    (copies of one row then load once per thread: the compiler merges unmasked loads of one address only)."""
    if EVEN_K:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=k_mask, other=0.0)
    return tile


@triton.jit
def _sum_tile(x_ptr, res_ptr, rows, ks, k_mask, stride_xm, stride_rm, HAS_RESIDUAL: tl.constexpr,
              EVEN_K: tl.constexpr):
    """x + residual over [rows, ks], rounded to the model dtype as gpu/kernels/rms_norm.py rounds it."""
    x = _load_along_k(x_ptr + rows[:, None] * stride_xm + ks[None, :], k_mask[None, :], EVEN_K)
    if HAS_RESIDUAL:
        residual = _load_along_k(res_ptr + rows[:, None] * stride_rm + ks[None, :], k_mask[None, :], EVEN_K)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return x


@triton.jit
def _rms_norm_rstd(x_ptr, res_ptr, sum_ptr, rows, offs_m, M, K, stride_xm, stride_rm, eps, writes_sum,
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
        s = _sum_tile(x_ptr, res_ptr, rows, ks, k_mask, stride_xm, stride_rm, HAS_RESIDUAL, EVEN_K)
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


@triton.jit
def _prologue_tile(x_ptr, res_ptr, norm_w_ptr, rows, ks, k_mask, K, stride_xm, stride_rm, rstd,
                   PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, ROW_COPIES: tl.constexpr):
    """The x tile [rows, ks] a prologue makes, in the model dtype. ROW_COPIES (rows all one row, the tile in the
    weight tile's layout): the norm weight is loaded in the tile's shape too, so that it needs no layout of its own."""
    dtype = x_ptr.dtype.element_ty
    if PROLOGUE == RMS_NORM:
        s = _sum_tile(x_ptr, res_ptr, rows, ks, k_mask, stride_xm, stride_rm, HAS_RESIDUAL, EVEN_K).to(tl.float32)
        normed = (s * rstd[:, None]).to(dtype).to(tl.float32)
        if ROW_COPIES:
            weight = _load_along_k(norm_w_ptr + (rows * 0)[:, None] + ks[None, :], k_mask[None, :], EVEN_K)
        else:
            weight = _load_along_k(norm_w_ptr + ks, k_mask, EVEN_K)[None, :]
        x = (weight.to(tl.float32) * normed).to(dtype)
    else:
        tile = x_ptr + rows[:, None] * stride_xm + ks[None, :]
        gate = _load_along_k(tile, k_mask[None, :], EVEN_K).to(tl.float32)
        up = _load_along_k(tile + K, k_mask[None, :], EVEN_K).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        x = (silu * up).to(dtype)
    return x


@triton.jit
def _prologue_rstd(x_ptr, res_ptr, sum_ptr, rows, offs_m, M, K, stride_xm, stride_rm, eps, writes_sum,
                   PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """The RMS prologue's per-row factor (ones for the others, which read none)."""
    if PROLOGUE == RMS_NORM:
        rstd = _rms_norm_rstd(x_ptr, res_ptr, sum_ptr, rows, offs_m, M, K, stride_xm, stride_rm, eps, writes_sum,
                              HAS_RESIDUAL, EVEN_K, BLOCK_M, BLOCK_K)
    else:
        rstd = tl.full((BLOCK_M,), 1.0, tl.float32)
    return rstd


@triton.jit
def _x_tile(x_ptrs, x_ptr, res_ptr, norm_w_ptr, rows, ks, k_end, K, stride_xm, stride_rm, rstd,
            EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ROW_COPIES: tl.constexpr):
    """The x tile [rows, ks] of the pointer kernel: loaded, or made by the prologue."""
    if PROLOGUE == NO_PROLOGUE:
        x = _load_along_k(x_ptrs, (ks < k_end)[None, :], EVEN_K)
    else:
        x = _prologue_tile(x_ptr, res_ptr, norm_w_ptr, rows, ks, ks < k_end, K, stride_xm, stride_rm, rstd,
                           PROLOGUE, HAS_RESIDUAL, EVEN_K, ROW_COPIES)
    return x


@triton.jit
def tile_ids(M, BLOCK_M: tl.constexpr):
    """(row tile, column tile, K slice) of this program, as the module's grid lays them out."""
    pid, num_m = tl.program_id(0), (M + BLOCK_M - 1) // BLOCK_M
    return pid % num_m, pid // num_m, tl.program_id(1)


@triton.jit(do_not_specialize=["M", "N"])
def _skinny_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    res_ptr, norm_w_ptr, sum_ptr, stride_rm, eps,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om,
    PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_PARTIAL: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n, pid_k = tile_ids(M, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_ptrs = w_ptr + rows_w[:, None] * stride_wn + (k_start + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + rows_x[:, None] * stride_xm + (k_start + offs_k)[None, :]  # [BLOCK_M, BLOCK_K]
    if not USE_DOT:
        # One weight tile ahead in registers. The first is asked for before waiting on the kernel that
        # writes x (programmatic dependent launch): weights never depend on it.
        if EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(k_start + offs_k)[None, :] < k_end, other=0.0)
    if USE_PDL:  # (the dot path's weight stream is Triton's software pipeline: there PDL only hides the launch)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rstd = _prologue_rstd(x_ptr, res_ptr, sum_ptr, rows_x, offs_m, M, K, stride_xm, stride_rm, eps,
                          (pid_n == 0) & (pid_k == 0), PROLOGUE, HAS_RESIDUAL, EVEN_K, BLOCK_M, BLOCK_K)
    if USE_DOT:
        acc = tl.full((BLOCK_N, BLOCK_M), 0.0, tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=((k + offs_k) < k_end)[None, :], other=0.0)
            x = _x_tile(x_ptrs, x_ptr, res_ptr, norm_w_ptr, rows_x, k + offs_k, k_end, K, stride_xm, stride_rm,
                        rstd, EVEN_K, PROLOGUE, HAS_RESIDUAL, False)
            acc = tl.dot(w, tl.trans(x), acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    elif BLOCK_M == 1:
        acc = _one_row_products(w, w_ptrs, x_ptr, res_ptr, norm_w_ptr, pid_m, rstd, k_start, k_end, K, stride_xm,
                                stride_rm, EVEN_K, PROLOGUE, HAS_RESIDUAL, BLOCK_N, BLOCK_K)
    else:
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            x = _x_tile(x_ptrs, x_ptr, res_ptr, norm_w_ptr, rows_x, k + offs_k, k_end, K, stride_xm, stride_rm,
                        rstd, EVEN_K, PROLOGUE, HAS_RESIDUAL, False)
            w_ptrs += BLOCK_K
            w_next = tl.load(w_ptrs, mask=(k + BLOCK_K + offs_k)[None, :] < k_end, other=0.0)
            acc += tl.reduce(w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :], 2, add)
            w = w_next
            x_ptrs += BLOCK_K
    _store_tile(acc, bias_ptr, out_ptr, offs_m, offs_n, pid_k, M, N, stride_os, stride_om, HAS_BIAS, IS_PARTIAL)


@triton.jit
def _one_row_products(w, w_ptrs, x_ptr, res_ptr, norm_w_ptr, row, rstd, k_start, k_end, K, stride_xm, stride_rm,
                      EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The fma path at one row: acc [1, BLOCK_N] of x's row `row` times W's tiles, `w` the first (loaded). x comes
    as BLOCK_N copies of its row in the weight tile's shape, so each thread multiplies the elements it holds (the
    multi-row product's broadcast over rows and columns sends both tiles through shared memory, with barriers, in
    every step); products add up across K tiles elementwise and are summed along K once, after the loop."""
    rows = tl.full((BLOCK_N,), 0, tl.int32) + row  # [BLOCK_N]: the one row, once per weight row
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (k_start + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    rstd = tl.broadcast_to(rstd, (BLOCK_N,))
    products = tl.full((BLOCK_N, BLOCK_K // VECTOR), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        w_ptrs += BLOCK_K
        w_next = tl.load(w_ptrs, mask=(k + BLOCK_K + offs_k)[None, :] < k_end, other=0.0)  # asked for first: HBM
        x = _x_tile(x_ptrs, x_ptr, res_ptr, norm_w_ptr, rows, k + offs_k, k_end, K, stride_xm, stride_rm, rstd,
                    EVEN_K, PROLOGUE, HAS_RESIDUAL, True)
        product = tl.reshape(w.to(tl.float32) * x.to(tl.float32), (BLOCK_N, BLOCK_K // VECTOR, VECTOR))
        products += tl.reduce(product, 2, add)
        w = w_next
        x_ptrs += BLOCK_K
    return tl.reduce(products, 1, add)[None, :]


@triton.jit
def _store_tile(acc, bias_ptr, out_ptr, offs_m, offs_n, pid_k, M, N, stride_os, stride_om,
                HAS_BIAS: tl.constexpr, IS_PARTIAL: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] float32 -> y (+ bias, one rounding), or this K slice's partial sums."""
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if IS_PARTIAL:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["M", "N"])
def _skinny_gemm_tma_kernel(
    x_desc, w_desc, bias_ptr, out_ptr,
    x_ptr, res_ptr, norm_w_ptr, sum_ptr, stride_xm, stride_rm, eps,
    M, N, K, k_per_split,
    stride_os, stride_om,
    PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_PARTIAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The dot path with tiles of x and W brought by the tensor memory accelerator (Hopper): the copy engine
    fills shared memory (rows past M, columns past N and K past its end read as zeros) and the loop only waits and
    multiplies, which frees the warps' issue slots that pointer loads spend on many rows. With a prologue only W's
    tiles come that way; x's are made from pointer loads (x_desc is then unused)."""
    pdl_start(USE_PDL)
    pid_m, pid_n, pid_k = tile_ids(M, BLOCK_M)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_x = tl.minimum(offs_m, M - 1)
    rstd = _prologue_rstd(x_ptr, res_ptr, sum_ptr, rows_x, offs_m, M, K, stride_xm, stride_rm, eps,
                          (pid_n == 0) & (pid_k == 0), PROLOGUE, HAS_RESIDUAL, False, BLOCK_M, BLOCK_K)
    acc = tl.full((BLOCK_N, BLOCK_M), 0.0, tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        w = w_desc.load([pid_n * BLOCK_N, k])  # [BLOCK_N, BLOCK_K]
        if PROLOGUE == NO_PROLOGUE:
            x = x_desc.load([pid_m * BLOCK_M, k])  # [BLOCK_M, BLOCK_K]
        else:
            ks = k + tl.arange(0, BLOCK_K)
            x = _prologue_tile(x_ptr, res_ptr, norm_w_ptr, rows_x, ks, ks < K, K, stride_xm, stride_rm, rstd,
                               PROLOGUE, HAS_RESIDUAL, False, False)
        acc = tl.dot(w, tl.trans(x), acc)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _store_tile(tl.trans(acc), bias_ptr, out_ptr, offs_m, offs_n, pid_k, M, N, stride_os, stride_om, HAS_BIAS,
                IS_PARTIAL)


@triton.jit(do_not_specialize=["N"])
def _split_k_reduce_kernel(
    part_ptr, bias_ptr, y_ptr,
    N, stride_ps, stride_pm, stride_ym,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pdl_start(USE_PDL)
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.full((BLOCK,), 0.0, tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * stride_ps + row * stride_pm + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _table(device: torch.device) -> Table:
    return table_for(device_name(device))


def preferred_config(num_rows: int, n: int, k: int, device: torch.device) -> SkinnyConfig | None:
    """The device's table entry for this shape (None: cuBLAS is as fast there), or the rule where it has none."""
    return table_preferred_config(num_rows, n, k, _table(device))


def prologue_config(num_rows: int, k: int, kind: str, device: torch.device) -> SkinnyConfig | None:
    """The config of a product over K with a `kind` ("norm" or "silu") prologue on this GPU, or None where the
    elementwise kernel and the product apart are as fast (gpu/kernels/skinny_gemm_configs.py's PROLOGUE_BUCKETS)."""
    return rule_prologue_config(num_rows, k, kind, prologue_buckets_for(device_name(device)))


def config_for(num_rows: int, n: int, k: int, device: torch.device) -> SkinnyConfig:
    """The config skinny_gemm runs with when given none: the device's table entry, else the rule's."""
    return table_config_for(num_rows, n, k, _table(device))


@dataclass(frozen=True)
class _Prologue:
    """How the kernel makes x's tiles: NO_PROLOGUE (loads x [M, K]), RMS_NORM (norm(x + residual) * norm_weight,
    writing x + residual into `summed`), SILU_AND_MUL (silu(x[:, :K]) * x[:, K:] of x [M, 2K])."""

    kind: int = NO_PROLOGUE.value
    residual: torch.Tensor | None = None
    norm_weight: torch.Tensor | None = None
    eps: float = 0.0
    summed: torch.Tensor | None = None


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, x_columns: int) -> None:
    """x_columns: the columns x must have, K (2K for the SiLU prologue's gate and up halves)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != x_columns:
        raise ValueError(f"x [M, {x_columns}] and weight [N, {weight.shape[-1]}] expected, got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"x and weight need unit stride along K, got {x.stride()} and {weight.stride()}")
    if x.dtype != weight.dtype or x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"x and weight must both be bf16 or fp16, got {x.dtype} and {weight.dtype}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"skinny_gemm takes 1..{MAX_ROWS} rows, got {x.shape[0]}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous [{weight.shape[0]}], got {tuple(bias.shape)}")


def _is_tma_aligned(t: torch.Tensor) -> bool:
    """A tensor the copy engine can read: 16-byte aligned base and row stride (else the pointer path runs)."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    use_pdl: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # [M, K] x [N, K] -> [M, N]
    """x @ weight.T (+ bias) for 1..MAX_ROWS rows of x; `config` overrides the table (tests, the sweep); `out`, an
    [M, N] tensor of x's dtype with unit stride along N, receives y (a buffer the caller reuses) and is returned.

    With `use_pdl` on a Hopper GPU the kernels are launched as programmatic dependent launches (gpu/kernels/pdl.py);
    the fma path reads its first weight tile before it waits for x (weights never depend on the kernel before)."""
    _check(x, weight, bias, weight.shape[1])
    return _launch(x, weight, bias, config, use_pdl, out, _Prologue())


def skinny_gemm_rms_norm(
    x: torch.Tensor,  # [M, K]
    residual: torch.Tensor | None,  # [M, K] or None
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    use_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) @ weight.T (+ bias), x + residual) with gpu/kernels/rms_norm.py's norm: one launch (two
    with split-K) for the norm's kernel and the product's. Without a residual, (norm(x) @ weight.T, x)."""
    _check(x, weight, bias, weight.shape[1])
    m, k = x.shape
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(1) != 1):
        raise ValueError(f"residual must match x ({x.dtype} {tuple(x.shape)}, unit stride along K), got "
                         f"{residual.dtype} {tuple(residual.shape)} strides {residual.stride()}")
    if norm_weight.shape != (k,) or norm_weight.dtype != x.dtype or not norm_weight.is_contiguous():
        raise ValueError(f"norm_weight must be contiguous [{k}] {x.dtype}, got {norm_weight.dtype} "
                         f"{tuple(norm_weight.shape)}")
    summed = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None else x
    y = _launch(x, weight, bias, config, use_pdl, None, _Prologue(RMS_NORM.value, residual, norm_weight, eps, summed))
    return y, summed


def skinny_gemm_silu_and_mul(
    gate_up: torch.Tensor,  # [M, 2K]: gate, then up
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    use_pdl: bool = False,
) -> torch.Tensor:
    """(silu(gate) * up) @ weight.T (+ bias) with gpu/kernels/silu_and_mul.py's rounding, in one launch (two with
    split-K) for that kernel's and the product's."""
    _check(gate_up, weight, bias, 2 * weight.shape[1])
    return _launch(gate_up, weight, bias, config, use_pdl, None, _Prologue(SILU_AND_MUL.value))


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: SkinnyConfig | None,
            use_pdl: bool, out: torch.Tensor | None, prologue: _Prologue) -> torch.Tensor:
    """The kernels of one product, x (or what the prologue makes of it) @ weight.T, for checked arguments."""
    m, (n, k) = x.shape[0], weight.shape
    c = config or config_for(m, n, k, x.device)
    if not c.use_dot and (m > FEW_ROWS or c.use_tma):
        raise ValueError(f"the fma path takes 1..{FEW_ROWS} rows and no TMA, got {m} rows and {c}")
    pdl = uses_pdl(use_pdl, x)
    if out is not None and (out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1):
        raise ValueError(f"out must be [{m}, {n}] {x.dtype} with unit stride along N, got {tuple(out.shape)} "
                         f"{out.dtype} strides {out.stride()}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    block_m = c.block_m if c.use_dot else row_bucket(m)
    k_per_split = triton.cdiv(triton.cdiv(k, c.split_k), c.block_k) * c.block_k
    is_partial = c.split_k > 1
    part = torch.empty((c.split_k, m, n), dtype=torch.float32, device=x.device) if is_partial else y
    bias_arg = bias if bias is not None else weight
    has_prologue = prologue.kind != NO_PROLOGUE.value
    residual = prologue.residual if prologue.residual is not None else x
    prologue_args = (residual, prologue.norm_weight if prologue.norm_weight is not None else weight,
                     prologue.summed if prologue.summed is not None else x)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, c.block_n), c.split_k)  # the kernels' `tile_ids`
    if c.use_tma and (has_prologue or _is_tma_aligned(x)) and _is_tma_aligned(weight):
        w_desc = TensorDescriptor.from_tensor(weight, [c.block_n, c.block_k])
        _skinny_gemm_tma_kernel[grid](
            w_desc if has_prologue else TensorDescriptor.from_tensor(x, [block_m, c.block_k]), w_desc, bias_arg,
            part, x, *prologue_args, x.stride(0), residual.stride(0), prologue.eps,
            m, n, k, k_per_split, part.stride(0) if is_partial else 0, part.stride(-2),
            PROLOGUE=prologue.kind, HAS_RESIDUAL=prologue.residual is not None,
            HAS_BIAS=bias is not None, IS_PARTIAL=is_partial, BLOCK_M=block_m, BLOCK_N=c.block_n,
            BLOCK_K=c.block_k, USE_PDL=pdl, num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
        )
    else:
        _skinny_gemm_kernel[grid](
            x, weight, bias_arg, part,
            *prologue_args, residual.stride(0), prologue.eps,
            m, n, k, k_per_split,
            x.stride(0), weight.stride(0), part.stride(0) if is_partial else 0, part.stride(-2),
            PROLOGUE=prologue.kind, HAS_RESIDUAL=prologue.residual is not None,
            HAS_BIAS=bias is not None, IS_PARTIAL=is_partial, EVEN_K=k % (c.block_k * c.split_k) == 0,
            USE_DOT=c.use_dot, USE_PDL=pdl, BLOCK_M=block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
        )
    if is_partial:
        block = min(triton.next_power_of_2(n), 1024)
        _split_k_reduce_kernel[(triton.cdiv(n, block), m)](
            part, bias_arg, y, n, part.stride(0), part.stride(1), y.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=c.split_k, USE_PDL=pdl, BLOCK=block, num_warps=4, launch_pdl=pdl,
        )
    return y
