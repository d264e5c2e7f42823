"""Triton kernels: a verifying step's layout and acceptance laid out on the device (gpu/device_verification.py's
`lay_out` and `accept`), one program a row each.

Written with torch operations, the two launch dozens of small kernels beside the forward (gathers of the rows' history
and lengths, casts, aranges, the block-table lookups of the cache slots, the acceptance's cumulative product, the
history's scatter), each a launch in the step's graph. Here the layout is one launch: a row's program finds its drafts
(gpu/kernels/ngram_drafts.py's `match_drafts`, reading the row's history slot in place), and writes its k + 1 tokens,
positions and cache slots, its context length and query start, and where the step's queries attend as decode rows
(gpu/attention/metadata.py's QueryRows) its queries' rows, lengths and block tables. The acceptance is another: a row's
program counts the leading drafts equal to the tokens sampled before them, appends the kept tokens to its history slot
and sets the slot's length.

The contract is the torch functions' (gpu/device_verification.py keeps them, the CPU's path and these kernels'
reference): every output equal, for lengths >= 1 (every slot a step reads holds a token: its last one is the step's
first input). Rows have distinct slots but padding rows, which share the padding slot, keep nothing and write its
length unchanged. No host sync; the grids and shapes depend only on the tensors' shapes (CUDA-graph capturable).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu.kernels.ngram_drafts import BLOCK, END_BITS, NUM_WARPS, match_drafts


@dataclass(frozen=True)
class FusedLayout:
    """The layout kernel's outputs (gpu/device_verification.py's VerifyInputs and AttentionMetadata take them)."""

    token_ids: torch.Tensor  # [R * (k + 1)] int64
    positions: torch.Tensor  # [R * (k + 1)] int64
    slot_mapping: torch.Tensor  # [R * (k + 1)] int64, -1 where the row's blocks do not cover the position
    context_lens: torch.Tensor  # [R] int32
    query_start_loc: torch.Tensor  # [R + 1] int32
    drafts: torch.Tensor  # [R, k] int64
    num_drafts: torch.Tensor  # [R] int64: k, or 0 where the lookup found nothing
    # With `as_rows`, the queries as decode rows: each one's row [R * (k + 1)] int64, its position + 1 (int32) and its
    # row's block table [R * (k + 1), max_blocks] int32.
    queries: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


TABLE_CHUNK = 64  # block-table entries a program copies at a time: a constant, so no table width compiles a variant
# Every argument unspecialized (no variant per pointer alignment or integer value): one compile per draft length and
# lookup, which gpu/device_verification.py's `warm_up` runs before any request; a row's few loads gain nothing from it.
_LAY_OUT_ARGUMENTS = ["tokens_ptr", "lengths_ptr", "slots_ptr", "num_blocks_ptr", "tables_ptr", "token_ids_ptr",
                      "positions_ptr", "slot_mapping_ptr", "context_lens_ptr", "query_start_ptr", "drafts_ptr",
                      "num_drafts_ptr", "query_rows_ptr", "query_lens_ptr", "query_tables_ptr", "tokens_stride",
                      "num_columns", "max_blocks", "block_size"]
_ACCEPT_ARGUMENTS = ["tokens_ptr", "lengths_ptr", "slots_ptr", "num_blocks_ptr", "sampled_ptr", "drafts_ptr",
                     "num_drafts_ptr", "counts_ptr", "tokens_stride", "max_model_len"]


@triton.jit(do_not_specialize=_LAY_OUT_ARGUMENTS)
def _lay_out_kernel(tokens_ptr, lengths_ptr, slots_ptr, num_blocks_ptr, tables_ptr, token_ids_ptr, positions_ptr,
                    slot_mapping_ptr, context_lens_ptr, query_start_ptr, drafts_ptr, num_drafts_ptr, query_rows_ptr,
                    query_lens_ptr, query_tables_ptr, tokens_stride, num_columns, max_blocks, block_size,
                    K: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr, AS_ROWS: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_: tl.constexpr, END_BITS_: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    row_tokens = tokens_ptr + slot * tokens_stride
    length = tl.load(lengths_ptr + slot).to(tl.int64)
    num_blocks = tl.load(num_blocks_ptr + row)
    j = tl.arange(0, BLOCK_Q)  # the row's positions: its last token's, then its drafts'
    is_position = j < K + 1
    first = row * (K + 1)
    token = tl.load(row_tokens + tl.maximum(length - 1, 0) + j * 0, mask=j == 0, other=0)  # the last token first
    if K > 0:
        num_found, draft = match_drafts(row_tokens, tl.minimum(length, num_columns).to(tl.int32), tl.maximum(j - 1, 0),
                                        K, MIN_N, MAX_N, BLOCK_, END_BITS_)  # position j's draft: the (j - 1)th
        is_draft = (j >= 1) & is_position
        token = tl.where(is_draft, draft, token)
        tl.store(drafts_ptr + row * K + j - 1, draft.to(tl.int64), mask=is_draft)
        tl.store(num_drafts_ptr + row, num_found.to(tl.int64))
    else:
        tl.store(num_drafts_ptr + row, tl.zeros((), tl.int64))
    positions = length - 1 + j
    block_index = positions // block_size
    table_entry = tl.load(tables_ptr + row * max_blocks + tl.minimum(block_index, max_blocks - 1), mask=is_position,
                          other=0).to(tl.int64)
    slot_mapping = tl.where(block_index < num_blocks, table_entry * block_size + positions % block_size, -1)
    tl.store(token_ids_ptr + first + j, token.to(tl.int64), mask=is_position)
    tl.store(positions_ptr + first + j, positions, mask=is_position)
    tl.store(slot_mapping_ptr + first + j, slot_mapping, mask=is_position)
    tl.store(context_lens_ptr + row, (length + K).to(tl.int32))
    tl.store(query_start_ptr + row, (row * (K + 1)).to(tl.int32))
    if row == tl.num_programs(0) - 1:
        tl.store(query_start_ptr + row + 1, ((row + 1) * (K + 1)).to(tl.int32))
    if AS_ROWS:
        tl.store(query_rows_ptr + first + j, (row + j * 0).to(tl.int64), mask=is_position)
        tl.store(query_lens_ptr + first + j, (positions + 1).to(tl.int32), mask=is_position)
        for start in range(0, max_blocks, BLOCK_B):  # a chunk of the row's table to each of its queries
            b = start + tl.arange(0, BLOCK_B)
            table = tl.load(tables_ptr + row * max_blocks + b, mask=b < max_blocks)
            for q in tl.static_range(K + 1):
                tl.store(query_tables_ptr + (first + q) * max_blocks + b, table, mask=b < max_blocks)


@triton.jit(do_not_specialize=_ACCEPT_ARGUMENTS)
def _accept_kernel(tokens_ptr, lengths_ptr, slots_ptr, num_blocks_ptr, sampled_ptr, drafts_ptr, num_drafts_ptr,
                   counts_ptr, tokens_stride, max_model_len, K: tl.constexpr, BLOCK_Q: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    length = tl.load(lengths_ptr + slot).to(tl.int64)
    j = tl.arange(0, BLOCK_Q)
    sampled = tl.load(sampled_ptr + row * (K + 1) + j, mask=j < K + 1, other=0)
    num_drafts = tl.load(num_drafts_ptr + row)
    if K > 0:
        drafts = tl.load(drafts_ptr + row * K + j, mask=j < K, other=0)
        is_equal = (drafts == sampled) & (j < num_drafts) & (j < K)  # draft j against the token sampled before it
        accepted = tl.min(tl.where(is_equal, BLOCK_Q, j), axis=0).to(tl.int64)  # the first that differs
    else:
        accepted = tl.zeros((), tl.int64)
    num_new = tl.where(tl.load(num_blocks_ptr + row) > 0, accepted + 1, 0)  # a padding row keeps nothing
    columns = length + j
    tl.store(tokens_ptr + slot * tokens_stride + columns, sampled.to(tl.int32),
             mask=(j < num_new) & (columns < max_model_len))
    tl.store(lengths_ptr + slot, tl.minimum(length + num_new, max_model_len).to(tl.int32))
    tl.store(counts_ptr + row * 2, accepted)
    tl.store(counts_ptr + row * 2 + 1, num_drafts)


def fused_lay_out(tokens: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor, num_blocks: torch.Tensor,
                  block_tables: torch.Tensor, num_drafts: int, min_n: int, max_n: int, block_size: int,
                  as_rows: bool) -> FusedLayout:
    """The step's layout (module doc): `tokens` [slots, L] int32 and `lengths` [slots] int32, the history's; `slots`
    and `num_blocks` [R] int64, `block_tables` [R, max_blocks] int32, the step's; `as_rows`: also the queries as
    decode rows."""
    num_rows, max_blocks = block_tables.shape
    num_positions, device = num_rows * (num_drafts + 1), tokens.device
    int64 = torch.empty(3 * num_positions + num_rows * num_drafts + num_rows + (num_positions if as_rows else 0),
                        dtype=torch.int64, device=device)
    token_ids, positions, slot_mapping, drafts, found, rows = int64.split(
        [num_positions, num_positions, num_positions, num_rows * num_drafts, num_rows,
         num_positions if as_rows else 0])
    int32 = torch.empty(2 * num_rows + 1 + (num_positions * (1 + max_blocks) if as_rows else 0), dtype=torch.int32,
                        device=device)
    context_lens, query_start_loc, query_lens, query_tables = int32.split(
        [num_rows, num_rows + 1, num_positions if as_rows else 0, num_positions * max_blocks if as_rows else 0])
    if num_rows:
        _lay_out_kernel[(num_rows,)](
            tokens, lengths, slots, num_blocks, block_tables, token_ids, positions, slot_mapping, context_lens,
            query_start_loc, drafts, found, rows, query_lens, query_tables, tokens.stride(0), tokens.shape[1],
            max_blocks, block_size, K=num_drafts, MIN_N=min_n, MAX_N=max_n, AS_ROWS=as_rows,
            BLOCK_Q=triton.next_power_of_2(num_drafts + 1), BLOCK_B=TABLE_CHUNK,
            BLOCK_=BLOCK, END_BITS_=END_BITS, num_warps=NUM_WARPS)
    else:
        query_start_loc.zero_()
    return FusedLayout(token_ids, positions, slot_mapping, context_lens, query_start_loc,
                       drafts.view(num_rows, num_drafts), found,
                       (rows, query_lens, query_tables.view(num_positions, max_blocks)) if as_rows else None)


def fused_accept(tokens: torch.Tensor, lengths: torch.Tensor, max_model_len: int, slots: torch.Tensor,
                 num_blocks: torch.Tensor, sampled: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor
                 ) -> torch.Tensor:
    """Accepts each row's drafts and appends its kept tokens to its history slot (module doc), no slot past
    `max_model_len` tokens; [R, 2] int64: the accepted and verified drafts of each row. `sampled` [R * (k + 1)]
    int64, `drafts` [R, k] and `num_drafts` [R] int64, the layout's."""
    num_rows, k = drafts.shape
    counts = torch.empty(num_rows, 2, dtype=torch.int64, device=tokens.device)
    if num_rows:
        _accept_kernel[(num_rows,)](tokens, lengths, slots, num_blocks, sampled, drafts, num_drafts, counts,
                                    tokens.stride(0), max_model_len, K=k,
                                    BLOCK_Q=triton.next_power_of_2(k + 1), num_warps=1)
    return counts
