"""Triton kernels: a step's (token, slot) pairs sorted by expert, each expert's run padded to a multiple of BLOCK_M,
so that every tile of BLOCK_M rows of the grouped GEMMs (gpu/kernels/fused_moe.py) belongs to one expert.

Pair p = token * top_k + slot routes to expert_ids.flat[p]. Outputs:
- `sorted_pairs` [max_padded] int32: expert 0's pairs, padded to a multiple of BLOCK_M with the sentinel
  num_pairs, then expert 1's, ...; within an expert, pairs in ascending order (deterministic: the same order as a
  stable sort by expert); after the last run, sentinels.
- `block_experts` [max_padded / BLOCK_M] int32: the expert of each tile of rows (past the last run: unspecified).
- `num_padded` [1] int32: where the last run ends; tiles from there on are skipped.
max_padded = num_pairs + min(num_experts, num_pairs) * (BLOCK_M - 1) bounds every routing, so every size depends on
the step's shape only: no host sync, and the launch is CUDA-graph capturable.

Pairs are taken in chunks of CHUNK, one program each. The count kernel writes each chunk's histogram and fills
its share of `sorted_pairs` with the sentinel; the place kernel sums the histograms (each program all of them:
expert starts; and those of the chunks before its own), then puts each pair at its expert's start + the pairs of
that expert in earlier chunks + its rank among them in its chunk (a cumulative sum over a one-hot [CHUNK,
experts] tile). With a single chunk (decode steps) one program does it all in one launch.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import add

MAX_TILE = 16384  # CHUNK * padded experts: the one-hot tile a program holds (and scans)


@dataclass(frozen=True)
class AlignedPairs:
    sorted_pairs: torch.Tensor  # [max_padded] int32
    block_experts: torch.Tensor  # [max_padded // block_m] int32
    num_padded: torch.Tensor  # [1] int32


def max_padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    return num_pairs + min(num_experts, num_pairs) * (block_m - 1)


@triton.jit
def _one_hot(ids_ptr, chunk, num_pairs, NUM_EXPERTS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr):
    """(pair indices [CHUNK], their one-hot experts [CHUNK, BLOCK_E] int32; zero rows past num_pairs)."""
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    is_pair = pairs < num_pairs
    ids = tl.load(ids_ptr + pairs, mask=is_pair, other=NUM_EXPERTS).to(tl.int32)
    experts = tl.arange(0, BLOCK_E)
    return pairs, ((ids[:, None] == experts[None, :]) & is_pair[:, None]).to(tl.int32)


@triton.jit
def _fill(sorted_ptr, start, end, value, FILL: tl.constexpr):
    for first in range(start, end, FILL):
        offsets = first + tl.arange(0, FILL)
        tl.store(sorted_ptr + offsets, value, mask=offsets < end)


@triton.jit
def _count_kernel(ids_ptr, hist_ptr, sorted_ptr, num_pairs, max_padded,
                  NUM_EXPERTS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, FILL: tl.constexpr,
                  USE_PDL: tl.constexpr):
    pdl_start(USE_PDL)
    chunk = tl.program_id(0)
    _, one_hot = _one_hot(ids_ptr, chunk, num_pairs, NUM_EXPERTS, CHUNK, BLOCK_E)
    tl.store(hist_ptr + chunk * BLOCK_E + tl.arange(0, BLOCK_E), tl.reduce(one_hot, 0, add))
    share = tl.cdiv(max_padded, tl.num_programs(0))
    _fill(sorted_ptr, chunk * share, tl.minimum(chunk * share + share, max_padded), num_pairs, FILL)


@triton.jit
def _place_kernel(ids_ptr, hist_ptr, sorted_ptr, block_experts_ptr, num_padded_ptr, num_pairs, max_padded,
                  num_chunks,
                  NUM_EXPERTS: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr,
                  ROWS: tl.constexpr, FILL: tl.constexpr, IS_SINGLE: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_start(USE_PDL)
    chunk = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    pairs, one_hot = _one_hot(ids_ptr, chunk, num_pairs, NUM_EXPERTS, CHUNK, BLOCK_E)
    if IS_SINGLE:
        counts = tl.reduce(one_hot, 0, add)
        earlier = tl.zeros([BLOCK_E], dtype=tl.int32)
        _fill(sorted_ptr, 0, max_padded, num_pairs, FILL)
        tl.debug_barrier()  # every sentinel written before any pair lands
    else:
        counts = tl.zeros([BLOCK_E], dtype=tl.int32)
        earlier = tl.zeros([BLOCK_E], dtype=tl.int32)  # this expert's pairs in the chunks before this one
        for first in range(0, num_chunks, ROWS):
            rows = first + tl.arange(0, ROWS)
            hist = tl.load(hist_ptr + rows[:, None] * BLOCK_E + experts[None, :], mask=rows[:, None] < num_chunks,
                           other=0)
            counts += tl.reduce(hist, 0, add)
            earlier += tl.reduce(tl.where(rows[:, None] < chunk, hist, 0), 0, add)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    rank = tl.reduce(tl.cumsum(one_hot, 0) * one_hot, 1, add) - 1  # among this chunk's pairs of its expert
    position = tl.reduce(one_hot * (starts + earlier)[None, :], 1, add) + rank
    tl.store(sorted_ptr + position, pairs.to(tl.int32), mask=pairs < num_pairs)
    if chunk == 0:
        tl.store(num_padded_ptr, tl.reduce(padded, 0, add))
        for first in range(0, tl.cdiv(max_padded, BLOCK_M), ROWS):
            blocks = first + tl.arange(0, ROWS)
            expert = tl.reduce((ends[None, :] <= blocks[:, None] * BLOCK_M).to(tl.int32), 1, add)
            tl.store(block_experts_ptr + blocks, expert, mask=blocks * BLOCK_M < max_padded)


def chunk_size(num_pairs: int, num_experts: int) -> int:
    """Pairs per program: all of a small step's (one launch), at most MAX_TILE / padded experts."""
    most = max(16, MAX_TILE // triton.next_power_of_2(num_experts))
    return min(most, max(16, triton.next_power_of_2(num_pairs)))


def align(expert_ids: torch.Tensor, num_experts: int, block_m: int, chunk: int | None = None,
          use_pdl: bool = False) -> AlignedPairs:
    """The pairs of expert_ids [num_tokens, top_k] (int32 or int64, contiguous) sorted by expert in runs padded to
    multiples of block_m. `chunk`: pairs per program, a power of two (default: `chunk_size`'s); `use_pdl`:
    programmatic dependent launches where the GPU has them."""
    if not expert_ids.is_contiguous():
        raise ValueError("expert_ids must be contiguous")
    num_pairs = expert_ids.numel()
    max_padded = max_padded_pairs(num_pairs, num_experts, block_m)
    device = expert_ids.device
    out = AlignedPairs(torch.empty(max_padded, dtype=torch.int32, device=device),
                       torch.empty(triton.cdiv(max_padded, block_m), dtype=torch.int32, device=device),
                       torch.empty(1, dtype=torch.int32, device=device))
    if num_pairs == 0:
        out.num_padded.zero_()
        return out
    chunk = chunk or chunk_size(num_pairs, num_experts)
    num_chunks = triton.cdiv(num_pairs, chunk)
    block_e = triton.next_power_of_2(num_experts)
    hist = torch.empty(num_chunks, block_e, dtype=torch.int32, device=device) if num_chunks > 1 else out.num_padded
    num_warps = 4 if chunk * block_e <= 4096 else 8
    pdl = uses_pdl(use_pdl, expert_ids)
    if num_chunks > 1:
        _count_kernel[(num_chunks,)](expert_ids, hist, out.sorted_pairs, num_pairs, max_padded,
                                     NUM_EXPERTS=num_experts, CHUNK=chunk, BLOCK_E=block_e, FILL=1024, USE_PDL=pdl,
                                     launch_pdl=pdl, num_warps=num_warps)
    _place_kernel[(num_chunks,)](expert_ids, hist, out.sorted_pairs, out.block_experts, out.num_padded, num_pairs,
                                 max_padded, num_chunks, NUM_EXPERTS=num_experts, BLOCK_M=block_m, CHUNK=chunk,
                                 BLOCK_E=block_e, ROWS=16, FILL=1024, IS_SINGLE=num_chunks == 1, USE_PDL=pdl,
                                 launch_pdl=pdl, num_warps=num_warps)
    return out
