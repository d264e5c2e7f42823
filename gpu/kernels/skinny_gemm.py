"""Triton kernel: skinny GEMM y = x @ W^T (+ bias) for a few rows (decode), reading W once at HBM speed.

x [M, K] with M <= MAX_ROWS, W [N, K] row-major, bias [N] or None; y [M, N] in x's dtype (bf16/fp16), sums in
float32, the bias added in float32 before the one rounding. A decode step at batch 1 is a chain of such products,
and at these sizes cuBLAS pays a fixed ~3 us per call and picks poor kernels for some shapes (H200, M=1, in CUDA
graphs: o_proj 1024x2048 12.7 us, this kernel 4.0 us; down 1024x3072 6.6 us against 4.9 us).

Grid: (blocks of BLOCK_N output columns, SPLIT_K slices of K). Each program streams its [BLOCK_N, K / SPLIT_K]
slice of W in [BLOCK_N, BLOCK_K] tiles of 16-byte loads and multiplies every tile with all rows of x (x is tiny
and stays in L2). Two inner products: `fma` (float32 products summed over K; few rows, no padding) and `dot`
(tensor cores, rows padded to 16). Rows past M and columns past N re-read the last valid row (no masks on the
weight stream); their sums are never stored. With SPLIT_K > 1 each program writes float32 partial sums to a
workspace [SPLIT_K, M, N] and a second kernel adds them in a fixed order (no atomics: deterministic).

Launch parameters come from a table measured on an H200 (bench/skinny_gemm_bench.py --sweep), keyed by (row
bucket, N, K), and a rule for other shapes. Nothing depends on the data, so a call is CUDA-graph capturable and
needs no tuning at warm-up. Invariants the wrapper checks: 2-d x and W with unit stride along K, same dtype.
Optional programmatic dependent launch (`use_pdl`, Hopper): the first weight tile is read before waiting on the
kernel that writes x.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # the dot path pads rows to 16: more rows are a real GEMM, cuBLAS's job


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    use_dot: bool = False
    num_warps: int = 4
    num_stages: int = 3


@triton.jit(do_not_specialize=["M", "N"])
def _skinny_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om,
    HAS_BIAS: tl.constexpr,
    IS_PARTIAL: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    rows_w = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_ptrs = w_ptr + rows_w[:, None] * stride_wn + (k_start + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + rows_x[:, None] * stride_xm + (k_start + offs_k)[None, :]  # [BLOCK_M, BLOCK_K]
    if USE_DOT:
        if USE_PDL:  # the weights' stream is Triton's software pipeline; PDL only hides the launch
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_ptrs)
                x = tl.load(x_ptrs)
            else:
                k_mask = (k + offs_k) < k_end
                w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0)
                x = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
            acc = tl.dot(w, tl.trans(x), acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    else:
        # One weight tile ahead in registers. The first is asked for before waiting on the kernel that
        # writes x (programmatic dependent launch): weights never depend on it.
        if EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(k_start + offs_k)[None, :] < k_end, other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            if EVEN_K:
                x = tl.load(x_ptrs)
            else:
                x = tl.load(x_ptrs, mask=(k + offs_k)[None, :] < k_end, other=0.0)
            w_ptrs += BLOCK_K
            w_next = tl.load(w_ptrs, mask=(k + BLOCK_K + offs_k)[None, :] < k_end, other=0.0)
            acc += tl.sum(w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :], axis=2)
            w = w_next
            x_ptrs += BLOCK_K
    out_ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if IS_PARTIAL:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["N"])
def _split_k_reduce_kernel(
    part_ptr, bias_ptr, y_ptr,
    N, stride_ps, stride_pm, stride_ym,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * stride_ps + row * stride_pm + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def row_bucket(num_rows: int) -> int:
    """1, 2, 4, 8 or 16: the padded decode batch sizes, and the rows one config serves."""
    return max(1, triton.next_power_of_2(num_rows))


def _fma(block_n: int = 4, block_k: int = 1024, split_k: int = 1) -> SkinnyConfig:
    return SkinnyConfig(block_n, block_k, split_k, use_dot=False, num_warps=4, num_stages=1)


def _dot(block_n: int, block_k: int, split_k: int = 1, num_warps: int = 4, num_stages: int = 4) -> SkinnyConfig:
    return SkinnyConfig(block_n, block_k, split_k, use_dot=True, num_warps=num_warps, num_stages=num_stages)


# The fastest config per (row bucket, N, K) in `python -m bench.skinny_gemm_bench --sweep` (H200, bf16, CUDA graphs,
# weights from HBM), or None where cuBLAS measured as fast without PDL (gpu/layers/linear.py then keeps F.linear).
# The Qwen3-0.6B shapes: qkv (4096, 1024), o_proj (1024, 2048), gate_up (6144, 1024), down (1024, 3072), lm_head
# (151936, 1024; cuBLAS already reads it at ~94% of the copy rate, as does this kernel).
TABLE: dict[tuple[int, int, int], SkinnyConfig | None] = {
    (1, 4096, 1024): None, (1, 1024, 2048): _fma(), (1, 6144, 1024): None, (1, 1024, 3072): _fma(),
    (2, 4096, 1024): None, (2, 1024, 2048): _fma(), (2, 6144, 1024): None, (2, 1024, 3072): _fma(),
    (4, 4096, 1024): _dot(64, 256), (4, 1024, 2048): _fma(), (4, 6144, 1024): None, (4, 1024, 3072): _dot(64, 128, 4),
    (8, 4096, 1024): _dot(64, 256), (8, 1024, 2048): _dot(64, 128, 4), (8, 6144, 1024): None,
    (8, 1024, 3072): _dot(64, 128, 4),
    (16, 4096, 1024): _dot(32, 128), (16, 1024, 2048): _dot(64, 128, 4), (16, 6144, 1024): None,
    (16, 1024, 3072): _dot(64, 128, 4),
    (1, 151936, 1024): _dot(128, 128, num_warps=8, num_stages=3), (2, 151936, 1024): _dot(128, 128, num_warps=8),
    (4, 151936, 1024): _dot(128, 128, num_warps=8), (8, 151936, 1024): _dot(128, 128, num_warps=8, num_stages=3),
    (16, 151936, 1024): _dot(32, 512, num_stages=2),
}


def default_config(bucket: int, n: int, k: int) -> SkinnyConfig:
    """The rule the table bears out, for other shapes: one row streams [4, K <= 1024] tiles with FMAs; more rows
    use tensor cores on [64, 128..256] tiles, split four ways along K when N is too narrow to fill the SMs."""
    if bucket == 1:
        return _fma(block_k=min(1024, max(16, triton.next_power_of_2(k))))
    if n <= 2048 and k >= 512:
        return _dot(64, 128, split_k=4)
    return _dot(64, 256 if k >= 256 else 128)


def preferred_config(num_rows: int, n: int, k: int) -> SkinnyConfig | None:
    """The table's entry (None: cuBLAS is as fast there), or the rule for a shape the table lacks."""
    key = (row_bucket(num_rows), n, k)
    return TABLE[key] if key in TABLE else default_config(*key)


def config_for(num_rows: int, n: int, k: int) -> SkinnyConfig:
    """The config skinny_gemm runs with when given none: the table's, else the rule's."""
    return preferred_config(num_rows, n, k) or default_config(row_bucket(num_rows), n, k)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x [M, K] and weight [N, K] expected, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"x and weight need unit stride along K, got {x.stride()} and {weight.stride()}")
    if x.dtype != weight.dtype or x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"x and weight must both be bf16 or fp16, got {x.dtype} and {weight.dtype}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"skinny_gemm takes 1..{MAX_ROWS} rows, got {x.shape[0]}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous [{weight.shape[0]}], got {tuple(bias.shape)}")


@functools.cache
def supports_pdl(device_index: int) -> bool:
    """Programmatic dependent launch (griddepcontrol) needs Hopper or newer."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def skinny_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
    use_pdl: bool = False,
) -> torch.Tensor:  # [M, K] x [N, K] -> [M, N]
    """x @ weight.T (+ bias) for 1..MAX_ROWS rows of x; `config` overrides the table (tests, the sweep).

    With `use_pdl` on a Hopper GPU the kernel is launched as a programmatic dependent launch: it starts while
    the kernel before it finishes, reads its first weight tile, and only then waits for x. Off by default: it
    saves ~0.7 us per call between kernels that trigger their dependents early (back-to-back products), but made
    the Qwen3-0.6B decode step slower, whose other kernels do not."""
    _check(x, weight, bias)
    (m, k), n = x.shape, weight.shape[0]
    c = config or config_for(m, n, k)
    pdl = use_pdl and supports_pdl(x.device.index if x.device.index is not None else torch.cuda.current_device())
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = 16 if c.use_dot else row_bucket(m)
    k_per_split = triton.cdiv(triton.cdiv(k, c.split_k), c.block_k) * c.block_k
    is_partial = c.split_k > 1
    out = torch.empty((c.split_k, m, n), dtype=torch.float32, device=x.device) if is_partial else y
    bias_arg = bias if bias is not None else weight
    _skinny_gemm_kernel[(triton.cdiv(n, c.block_n), c.split_k)](
        x, weight, bias_arg, out,
        m, n, k, k_per_split,
        x.stride(0), weight.stride(0), out.stride(0) if is_partial else 0, out.stride(-2),
        HAS_BIAS=bias is not None, IS_PARTIAL=is_partial, EVEN_K=k % (c.block_k * c.split_k) == 0,
        USE_DOT=c.use_dot, USE_PDL=pdl, BLOCK_M=block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )
    if is_partial:
        block = min(triton.next_power_of_2(n), 1024)
        _split_k_reduce_kernel[(triton.cdiv(n, block), m)](
            out, bias_arg, y, n, out.stride(0), out.stride(1), y.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=c.split_k, USE_PDL=pdl, BLOCK=block, num_warps=4, launch_pdl=pdl,
        )
    return y
