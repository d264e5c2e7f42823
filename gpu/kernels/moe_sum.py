"""Triton kernel: each token's rows summed into one, in float32 and in row order (deterministic: no atomics), plus an
optional `add` (a shared experts' output) in the same sum; one rounding. The grouped MoE path sums a token's top k
scaled rows with it (gpu/kernels/fused_moe.py), the decode path its slot groups' partial sums
(gpu/kernels/moe_decode.py)."""

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start


@triton.jit
def _sum_kernel(rows_ptr, add_ptr, out_ptr, hidden, TOP_K: tl.constexpr, HAS_ADD: tl.constexpr, BLOCK: tl.constexpr,
                USE_PDL: tl.constexpr):
    """out[t] = (add[t] +) sum of rows[t * TOP_K + k] over k, in float32, one rounding."""
    pdl_start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_column = columns < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_ADD:
        acc += tl.load(add_ptr + token * hidden + columns, mask=is_column, other=0.0).to(tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(rows_ptr + (token * TOP_K + k) * hidden + columns, mask=is_column, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * hidden + columns, acc.to(out_ptr.dtype.element_ty), mask=is_column)


def sum_rows(rows: torch.Tensor, add: torch.Tensor | None, out: torch.Tensor, pdl: bool) -> torch.Tensor:
    """out [tokens, hidden] = (add +) the sum of each token's rows of `rows` [tokens * k, hidden] (contiguous, each
    token's k rows together); `pdl`: a programmatic dependent launch (already resolved for the device)."""
    num_tokens, hidden = out.shape
    block = min(triton.next_power_of_2(hidden), 1024)
    _sum_kernel[(num_tokens, triton.cdiv(hidden, block))](rows, add if add is not None else rows, out, hidden,
                                                          TOP_K=rows.shape[0] // num_tokens, HAS_ADD=add is not None,
                                                          BLOCK=block, USE_PDL=pdl, launch_pdl=pdl, num_warps=4)
    return out
