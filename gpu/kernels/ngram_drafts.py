"""Triton kernel: prompt-lookup drafts found on the device, from the device's own token history.

A verifying step whose drafts come from the host must wait for the step before it (the host has to see the accepted
tokens before it can look them up and lay out the next step), so host and device take turns. Drafts made here, from
a history the device keeps itself, let a verifying step be laid out on the device and overlap the host as a plain
decode step does. The definition is core/ngram_proposer.py's `lookup_draft`, which this restates only as a search:
the draft is what followed the latest earlier occurrence of the longest suffix of length in [min_n, max_n] (ending
before the last token), continued periodically where it reaches the end; none occurs, no draft.

One program per row scans the row's match ends from the last tile back, each tile BLOCK ends wide: per end, the
number of tokens (up to MAX_N) it shares with the row's suffix; the best end so far is kept as one key, n above the
end, so the largest key is the longest n and, among those, the latest end. The scan stops at the first tile that
holds a match of MAX_N (no earlier end can beat it). Work per row is O(length * MAX_N) at most; no host sync, and
the grid and shapes depend only on the tensors' shapes (CUDA-graph capturable).
Invariants the wrapper checks: history [R, L] int32 with unit stride along L, lengths [R] int32, on one device;
0 < L < 2**END_BITS. Lengths above L count as L (the kernel never reads past a row).
"""

import torch
import triton
import triton.language as tl

from gpu.token_history import MAX_LOOKUP

BLOCK = 1024
NUM_WARPS = 4
END_BITS = 24  # a key is n << END_BITS | end


@triton.jit
def latest_match(tokens_ptr, num_tokens, MIN_N: tl.constexpr, MAX_N: tl.constexpr, BLOCK_: tl.constexpr,
                 END_BITS_: tl.constexpr):
    """The lookup's match in a row's first `num_tokens` tokens: (whether one is found, where it ends, the last token's
    index), the end that of the longest suffix in [MIN_N, MAX_N] that occurs earlier, the latest such."""
    last = num_tokens - 1  # a match ends before it
    offsets = tl.arange(0, BLOCK_)
    best = tl.full((), -1, tl.int32)
    start = (tl.maximum(last - 1, 0) // BLOCK_) * BLOCK_
    while (start >= 0) & (best < (MAX_N << END_BITS_)):
        ends = start + offsets
        is_matching = ends < last
        n = tl.zeros((BLOCK_,), tl.int32)
        for j in tl.static_range(MAX_N):
            is_matching = is_matching & (ends >= j)
            suffix_token = tl.load(tokens_ptr + tl.maximum(last - j, 0))  # used where ends >= j, so j < last
            token = tl.load(tokens_ptr + ends - j, mask=is_matching, other=0)
            is_matching = is_matching & (token == suffix_token)
            n += is_matching.to(tl.int32)
        keys = tl.where(n >= MIN_N, (n << END_BITS_) | ends, -1)
        best = tl.maximum(best, tl.max(keys, axis=0))
        start -= BLOCK_
    return best >= 0, best & ((1 << END_BITS_) - 1), last


@triton.jit
def match_drafts(tokens_ptr, num_tokens, d, K: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
                 BLOCK_: tl.constexpr, END_BITS_: tl.constexpr):
    """The lookup's draft count (K, or 0 without a match) and its drafts at indices `d` (0 past the count): what
    followed the `latest_match`, repeated where it reaches the last token."""
    is_found, end, last = latest_match(tokens_ptr, num_tokens, MIN_N, MAX_N, BLOCK_, END_BITS_)
    period = tl.where(is_found, last - end, 1)
    num_found = tl.where(is_found, K, 0)
    return num_found, tl.load(tokens_ptr + end + 1 + d % period, mask=d < num_found, other=0)


@triton.jit(do_not_specialize=["history_stride", "num_columns"])
def _ngram_drafts_kernel(history_ptr, lengths_ptr, drafts_ptr, num_drafts_ptr, history_stride, num_columns,
                         MIN_N: tl.constexpr, MAX_N: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_: tl.constexpr, END_BITS_: tl.constexpr):
    row = tl.program_id(0)
    tokens_ptr = history_ptr + row.to(tl.int64) * history_stride
    num_tokens = tl.minimum(tl.load(lengths_ptr + row), num_columns)
    j = tl.arange(0, BLOCK_K)
    num_drafts, drafts = match_drafts(tokens_ptr, num_tokens, j, K, MIN_N, MAX_N, BLOCK_, END_BITS_)
    tl.store(drafts_ptr + row * K + j, drafts, mask=j < K)
    tl.store(num_drafts_ptr + row, num_drafts)


def ngram_drafts(
    history: torch.Tensor,  # [R, L] int32: each row's tokens so far, left-aligned
    lengths: torch.Tensor,  # [R] int32: tokens valid per row
    max_drafts: int,
    min_n: int,
    max_n: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `lookup_draft(tokens, max_drafts, min_n, max_n)` (core/ngram_proposer.py) for its first
    `lengths[row]` tokens: drafts [R, max_drafts] int32 (0 past a row's count) and num_drafts [R] int32 (max_drafts
    or 0). No host sync; the grid depends on shapes only."""
    _check(history, lengths, max_drafts, min_n, max_n)
    num_rows = history.shape[0]
    drafts = torch.empty(num_rows, max_drafts, dtype=torch.int32, device=history.device)
    num_drafts = torch.empty(num_rows, dtype=torch.int32, device=history.device)
    if num_rows:
        _ngram_drafts_kernel[(num_rows,)](
            history, lengths, drafts, num_drafts, history.stride(0), history.shape[1], MIN_N=min_n, MAX_N=max_n,
            K=max_drafts, BLOCK_K=triton.next_power_of_2(max_drafts), BLOCK_=BLOCK, END_BITS_=END_BITS,
            num_warps=NUM_WARPS)
    return drafts, num_drafts


def _check(history: torch.Tensor, lengths: torch.Tensor, max_drafts: int, min_n: int, max_n: int) -> None:
    if history.dim() != 2 or history.dtype != torch.int32 or history.stride(1) != 1:
        raise ValueError(f"history must be 2-d int32 with unit stride along the tokens, got {history.dtype} "
                         f"{tuple(history.shape)} strides {history.stride()}")
    if not 0 < history.shape[1] < 1 << END_BITS:  # the kernel reads a row's first token whatever its length
        raise ValueError(f"history holds 1 to {(1 << END_BITS) - 1} tokens a row, got {history.shape[1]}")
    if lengths.shape != history.shape[:1] or lengths.dtype != torch.int32 or not lengths.is_contiguous():
        raise ValueError(f"lengths must be contiguous [{history.shape[0]}] int32, got {lengths.dtype} "
                         f"{tuple(lengths.shape)}")
    if lengths.device != history.device:
        raise ValueError(f"lengths is on {lengths.device}, history on {history.device}")
    if max_drafts < 1 or not 1 <= min_n <= max_n <= MAX_LOOKUP:
        raise ValueError(f"need max_drafts >= 1 and 1 <= min_n <= max_n <= {MAX_LOOKUP}, got max_drafts "
                         f"{max_drafts}, min_n {min_n}, max_n {max_n}")
