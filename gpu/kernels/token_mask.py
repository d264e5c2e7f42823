"""Triton kernel: allowed-token bitmasks (structured output) applied to logits, in place, in one pass.

logits[rows[i], t] = -inf where bit t % 32 of word t // 32 of bitmask row i is clear, and for every t past
the mask's words (gpu/token_mask.py's layout; its torch code is the reference). The torch reference
unpacks the bits into [rows, 32 * words] tensors and gathers and scatters the rows (about 1 GB a step at
256 rows of 151,936 tokens); here each program reads its block's words and writes only the disallowed
logits. Grid (masked row, vocab block).
Invariants the wrapper checks: logits 2-d with unit stride along the vocab (any float dtype); rows [n]
int64 and bitmask [n, words] int32, contiguous, on the logits' device.
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8


@triton.jit(do_not_specialize=["logits_stride", "num_words"])  # one compiled variant per vocabulary and dtype
def _token_mask_kernel(logits_ptr, rows_ptr, bitmask_ptr, logits_stride, num_words,
                       VOCAB: tl.constexpr, BLOCK_: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * BLOCK_ + tl.arange(0, BLOCK_)
    words = ids // 32
    word = tl.load(bitmask_ptr + i * num_words + words, mask=words < num_words, other=0)
    is_allowed = ((word >> (ids % 32)) & 1) != 0
    row = tl.load(rows_ptr + i)
    tl.store(logits_ptr + row * logits_stride + ids, float("-inf"), mask=(ids < VOCAB) & ~is_allowed)


def apply_token_bitmask(
    logits: torch.Tensor,  # [num_rows, vocab], changed in place
    rows: torch.Tensor,  # [n] int64: the masked rows of `logits`
    bitmask: torch.Tensor,  # [n, num_words] int32
) -> None:
    """No host sync; the grid depends on shapes only."""
    _check(logits, rows, bitmask)
    if not len(rows):
        return
    vocab = logits.shape[1]
    _token_mask_kernel[(len(rows), triton.cdiv(vocab, BLOCK))](
        logits, rows, bitmask, logits.stride(0), bitmask.shape[1], VOCAB=vocab, BLOCK_=BLOCK, num_warps=NUM_WARPS)


def _check(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    if logits.dim() != 2 or not logits.dtype.is_floating_point or logits.stride(1) != 1:
        raise ValueError(f"logits must be 2-d floats with unit stride along the vocab, got {logits.dtype} "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if rows.dim() != 1 or rows.dtype != torch.int64 or not rows.is_contiguous():
        raise ValueError(f"rows must be contiguous 1-d int64, got {rows.dtype} {tuple(rows.shape)}")
    if bitmask.dim() != 2 or bitmask.shape[0] != len(rows) or bitmask.dtype != torch.int32 \
            or not bitmask.is_contiguous():
        raise ValueError(f"bitmask must be contiguous [{len(rows)}, words] int32, got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")
    for name, tensor in (("rows", rows), ("bitmask", bitmask)):
        if tensor.device != logits.device:
            raise ValueError(f"{name} is on {tensor.device}, logits on {logits.device}")
