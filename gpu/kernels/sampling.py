"""Triton sampling: one read of the logits per row picks its token, greedy or random (Gumbel-max).

A greedy row (temperature 0) takes argmax(logits), the first index among equal maxima, as
torch.argmax does. A random row takes argmax(logits / T - log(E)) with E ~ Exp(1) drawn per token:
the exponential race (Gumbel-max, -log(E) being Gumbel noise), which draws exactly from
softmax(logits / T) with no softmax, no normalizer and no second pass. E comes from in-kernel
Philox (`tl.randint4x`) keyed by the row's 64-bit seed, with counter = token's tile-local lane:
token v of a row always gets the same uniform for the same seed, whatever the batch, the number of
splits or the launch grid, so a seeded row draws the same token alone or in any batch.

Grid (row, split): each program scans a contiguous run of TILE-token tiles of its row, keeping a
running maximum per lane (no reduction inside the loop), reduces it once, and writes one partial
(best score, token id); a second tiny kernel takes the best partial of each row (the first split on
ties). Splits only fill the GPU at small batch sizes; they never change a result.

Precision of the noise: the 31-bit uniform d is centred on its grid (never 0 or 1) and
E = -log1p(-d) is taken as a series for small d, so E resolves down to 2^-32 and the Gumbel tail
reaches 22 (float32 `-log(u)` would stop at 16.6 and let u round to 1, a token with infinite score).
Logs are the hardware's approximate log2 (relative error ~2^-22), the race scaled by log2(e).
Invariants the wrapper checks: logits are 2-d [num_rows, vocab] bf16/fp16/fp32 with unit stride
along the vocab (any row stride, 0 included); seeds [num_rows] int64 and temperatures [num_rows]
float32 (0 marks a greedy row) are contiguous on the same device. Every output element is written.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from gpu.kernels.pdl import pdl_start, uses_pdl

# A tile is 4 blocks of SUB tokens: one Philox call gives 4 uniforms per lane (randint4x), one per
# block. SUB fixes which uniform each token gets, so it is part of the seeded streams' definition.
SUB = 1024
TILE = 4 * SUB
NUM_WARPS = 4
# Programs per multiprocessor the splits aim for: the kernel is bound by Philox arithmetic, not by the logits'
# bytes, so more programs in flight than a memory-bound kernel needs.
PROGRAMS_PER_SM = 8
MAX_SPLITS = 64
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INT32_MAX = 2**31 - 1
_NO_TOKEN = tl.constexpr(INT32_MAX)  # the id of "no candidate yet", above every token id
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exponential_log2e(bits):
    """log2(e) * Exp(1) from 32 random bits: d uniform on a centred 31-bit grid, E = -log1p(-d)."""
    d = ((bits >> 1).to(tl.float32) + 0.5) * 4.656612873077393e-10  # (k + 1/2) / 2^31
    # log(1 - d) loses d's low bits once 1 - d rounds; the series is exact to float32 for d < 2^-6.
    series = d * (1.0 + d * (0.5 + d * (0.3333333333 + d * 0.25))) * _LOG2E
    return tl.where(d < 0.015625, series, -libdevice.fast_log2f(1.0 - d))


@triton.jit
def _update(best, best_ids, row_ptr, ids, noise, scale, VOCAB: tl.constexpr, HAS_NOISE: tl.constexpr):
    """Per-lane running max; strict > keeps the smaller token id of a tie (ids only grow per lane)."""
    x = tl.load(row_ptr + ids, mask=ids < VOCAB, other=float("-inf")).to(tl.float32)
    if HAS_NOISE:
        # log2(e) * (x / T - log(E)) less the constant log2(log2(e)): the same argmax, base-2 logs.
        x = x * scale - libdevice.fast_log2f(noise)
    is_better = x > best
    return tl.where(is_better, x, best), tl.where(is_better, ids, best_ids)


@triton.jit
def _scan(row_ptr, tile_begin, tile_end, seed, scale,
          VOCAB: tl.constexpr, SUB_: tl.constexpr, HAS_NOISE: tl.constexpr):
    lanes = tl.arange(0, SUB_)
    best = tl.full([SUB_], float("-inf"), tl.float32)
    best_ids = tl.full([SUB_], _NO_TOKEN, tl.int32)
    for tile in range(tile_begin, tile_end):
        ids = tile * (4 * SUB_) + lanes
        if HAS_NOISE:
            r0, r1, r2, r3 = tl.randint4x(seed, tile * SUB_ + lanes)
            e0, e1 = _exponential_log2e(r0), _exponential_log2e(r1)
            e2, e3 = _exponential_log2e(r2), _exponential_log2e(r3)
            best, best_ids = _update(best, best_ids, row_ptr, ids, e0, scale, VOCAB, True)
            best, best_ids = _update(best, best_ids, row_ptr, ids + SUB_, e1, scale, VOCAB, True)
            best, best_ids = _update(best, best_ids, row_ptr, ids + 2 * SUB_, e2, scale, VOCAB, True)
            best, best_ids = _update(best, best_ids, row_ptr, ids + 3 * SUB_, e3, scale, VOCAB, True)
        else:
            for block in tl.static_range(4):
                best, best_ids = _update(best, best_ids, row_ptr, ids + block * SUB_, 1.0, 1.0, VOCAB, False)
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_ids, _NO_TOKEN), axis=0)


# The split counts follow the batch's rows: not specialized (see prefill_attention.py).
@triton.jit(do_not_specialize=["tiles_per_split", "num_splits"])
def _sample_split_kernel(
    logits_ptr,
    seeds_ptr,
    temperatures_ptr,
    partial_scores_ptr,  # [num_rows, num_splits] float32
    partial_ids_ptr,  # [num_rows, num_splits] int32
    logits_stride,
    tiles_per_split,
    num_splits,
    VOCAB: tl.constexpr,
    SUB_: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    tile_begin = split * tiles_per_split
    num_tiles: tl.constexpr = (VOCAB + 4 * SUB_ - 1) // (4 * SUB_)
    tile_end = tile_begin + tiles_per_split
    tile_end = tl.where(tile_end < num_tiles, tile_end, num_tiles)
    row_ptr = logits_ptr + row * logits_stride
    temperature = tl.load(temperatures_ptr + row)
    if temperature == 0.0:
        score, token_id = _scan(row_ptr, tile_begin, tile_end, 0, 1.0, VOCAB, SUB_, False)
    else:
        seed = tl.load(seeds_ptr + row)
        score, token_id = _scan(row_ptr, tile_begin, tile_end, seed, _LOG2E / temperature, VOCAB, SUB_, True)
    tl.store(partial_scores_ptr + row * num_splits + split, score)
    tl.store(partial_ids_ptr + row * num_splits + split, token_id)


@triton.jit(do_not_specialize=["num_splits"])
def _pick_split_kernel(partial_scores_ptr, partial_ids_ptr, out_ptr, num_splits,
                       VOCAB: tl.constexpr, SPLITS_P2: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    splits = tl.arange(0, SPLITS_P2)
    scores = tl.load(partial_scores_ptr + row * num_splits + splits, mask=splits < num_splits, other=float("-inf"))
    best_split = tl.argmax(scores, axis=0, tie_break_left=True)
    token_id = tl.load(partial_ids_ptr + row * num_splits + best_split)
    # A row whose every score is -inf (all logits -inf) has no candidate: token 0, as torch.argmax.
    tl.store(out_ptr + row, tl.where(token_id < VOCAB, token_id, 0).to(tl.int64))


def sample_tokens(
    logits: torch.Tensor,  # [num_rows, vocab] bf16/fp16/fp32
    seeds: torch.Tensor,  # [num_rows] int64, the Philox key of each row (unused on greedy rows)
    temperatures: torch.Tensor,  # [num_rows] float32, 0 on greedy rows
    use_pdl: bool = False,  # programmatic dependent launches where the GPU has them (gpu/kernels/pdl.py)
) -> torch.Tensor:
    """[num_rows] int64 token ids; no host sync, graph-capturable (the grid depends on shapes only)."""
    _check(logits, seeds, temperatures)
    num_rows, vocab = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    num_tiles = triton.cdiv(vocab, TILE)
    tiles_per_split = triton.cdiv(num_tiles, choose_num_splits(num_rows, num_tiles, _num_sms(logits.device)))
    num_splits = triton.cdiv(num_tiles, tiles_per_split)  # no empty split
    partial_scores = torch.empty((num_rows, num_splits), dtype=torch.float32, device=logits.device)
    partial_ids = torch.empty((num_rows, num_splits), dtype=torch.int32, device=logits.device)
    pdl = uses_pdl(use_pdl, logits)
    _sample_split_kernel[(num_rows, num_splits)](
        logits, seeds, temperatures, partial_scores, partial_ids, logits.stride(0), tiles_per_split, num_splits,
        VOCAB=vocab, SUB_=SUB, USE_PDL=pdl, num_warps=NUM_WARPS, launch_pdl=pdl,
    )
    _pick_split_kernel[(num_rows,)](
        partial_scores, partial_ids, out, num_splits, VOCAB=vocab, SPLITS_P2=triton.next_power_of_2(num_splits),
        USE_PDL=pdl, num_warps=1, launch_pdl=pdl,
    )
    return out


def choose_num_splits(num_rows: int, num_tiles: int, num_sms: int) -> int:
    """Splits per row: about PROGRAMS_PER_SM programs per multiprocessor, at least one tile each."""
    return max(1, min(-(-PROGRAMS_PER_SM * num_sms // num_rows), num_tiles, MAX_SPLITS))


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(logits: torch.Tensor, seeds: torch.Tensor, temperatures: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.dtype not in DTYPES or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(f"logits must be 2-d [num_rows, vocab] bf16/fp16/fp32 with unit stride along the vocab, "
                         f"got {logits.dtype} {tuple(logits.shape)} strides {logits.stride()}")
    if not 0 < logits.shape[1] <= INT32_MAX - TILE:
        raise ValueError(f"vocab size {logits.shape[1]} out of range")
    for name, tensor, dtype in (("seeds", seeds, torch.int64), ("temperatures", temperatures, torch.float32)):
        if tensor.shape != (logits.shape[0],) or tensor.dtype != dtype or not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{logits.shape[0]}] {dtype}, got {tensor.dtype} "
                             f"{tuple(tensor.shape)} strides {tensor.stride()}")
        if tensor.device != logits.device:
            raise ValueError(f"{name} is on {tensor.device}, logits on {logits.device}")
