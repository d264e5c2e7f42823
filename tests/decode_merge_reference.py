"""The two-kernel decode attention's merge, as a reference for the split kernel that merges its own splits
(gpu/kernels/decode_attention.py): the separate merge kernel it replaced, one program per (row, head), and a way to
keep the partials a launch wrote so the reference can merge them again. Used by the interpreted cases
(tests/unit/attention_kernels_interpreted_cases.py) and tests/gpu/test_decode_merge_gpu.py."""

import pytest
import torch
import triton
import triton.language as tl

from gpu.kernels import decode_attention as decode_module
from gpu.kernels.attention_variant import LOG2_E


@triton.jit
def _reference_merge_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    sinks_ptr,  # HAS_SINKS: [num_heads]; else unused
    out_ptr,
    out_stride_t,
    out_stride_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    partial_rows = (row * num_heads + head) * NUM_SPLITS + offs_s
    lse = tl.load(partial_lse_ptr + partial_rows)
    lse_max = tl.max(lse, 0)
    if HAS_SINKS:
        sink_log2 = tl.load(sinks_ptr + head).to(tl.float32) * LOG2_E
        lse_max = tl.maximum(lse_max, sink_log2)
    weights = tl.where(lse > float("-inf"), tl.exp2(lse - lse_max), 0.0)
    d_mask = offs_d < HEAD_DIM
    part_offsets = partial_rows[:, None] * HEAD_DIM + offs_d[None, :]
    parts = tl.load(partial_out_ptr + part_offsets, mask=d_mask[None, :], other=0.0)
    total = tl.sum(weights, 0)
    if HAS_SINKS:
        total += tl.exp2(sink_log2 - lse_max)
    out = tl.sum(weights[:, None] * parts, 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + row * out_stride_t + head * out_stride_h + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def reference_merge(partial_out: torch.Tensor, partial_lse: torch.Tensor, sinks: torch.Tensor | None,
                    like: torch.Tensor) -> torch.Tensor:
    """[rows, heads, head_dim] in `like`'s dtype: the partials [rows, heads, splits, head_dim] merged."""
    num_rows, num_heads, num_splits, head_dim = partial_out.shape
    out = torch.full_like(like, float("nan"))
    _reference_merge_kernel[(num_rows, num_heads)](
        partial_out, partial_lse, sinks if sinks is not None else partial_lse, out, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), NUM_SPLITS=num_splits,
        HAS_SINKS=sinks is not None, num_warps=4)
    return out


def keep_partials(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """From now on each split launch's partial buffers are appended to the returned list."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    make = decode_module._partials

    def keeping(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        kept.append(make(*args))
        return kept[-1]

    monkeypatch.setattr(decode_module, "_partials", keeping)
    return kept
