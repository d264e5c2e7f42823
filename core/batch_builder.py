"""Flattens one step's scheduled sequences into the runner's plain `Batch`.

This is the only place that turns sequences into positions, cache slots and sampling rows, so it
is testable without a device. A penalized sequence takes its penalty slot here, at its first
sampled row (after a preemption too), with the tokens that fill the slot. A pooling sequence gets a
pooling row instead of a sampling row; one whose prompt runs in several chunks takes a pooling slot
at its first chunk, where the runner keeps what the chunks pooled so far. Each KV-cache group has its own slots and
block tables (core/block_manager.py): group 0's are the batch's, the others' go to `other_groups`. A model with
linear-attention layers gets each row's state slot: a sequence takes one at its first row and keeps it until it
finishes or is preempted.
"""

from core.penalty_slots import PenaltySlots
from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from core.state_snapshots import LinearStates
from gpu.batch import Batch, GroupTables, Penalties, PenaltySlotInit, PoolingRow, PromptLogprobsRow, RowSampling


def build_batch(scheduled: list[ScheduledSequence], block_size: int, eos_token_ids: tuple[int, ...],
                penalty_slots: PenaltySlots | None = None, scored: list[Sequence] | None = None,
                pooling_slots: PenaltySlots | None = None, linear_states: LinearStates | None = None) -> Batch:
    """`scored` receives the sequences of the batch's prompt_logprobs rows, in their order; `linear_states`: a model
    with linear-attention layers' state slots and snapshots."""
    batch = Batch(token_ids=[], positions=[], slot_mapping=[], query_lens=[], context_lens=[], block_tables=[])
    token_ids, positions, slot_mapping = batch.token_ids, batch.positions, batch.slot_mapping
    # Every scheduled sequence holds a table per group.
    num_other_groups = len(scheduled[0].seq.block_tables) - 1 if scheduled else 0
    group_slots: list[list[int]] = [[] for _ in range(num_other_groups)]
    group_tables: list[list[list[int]]] = [[] for _ in range(num_other_groups)]
    draft_counts: list[int] = []  # per row: the draft tokens it verifies (speculative decoding)
    for s in scheduled:
        seq, start, end = s.seq, s.start, s.start + s.num_new_tokens
        block_ids = seq.block_tables[0]
        num_known = len(seq.token_ids)
        num_drafts = end - seq.num_tokens if end > seq.num_tokens else 0
        draft_counts.append(num_drafts)
        if num_drafts:  # the row's last known token, then its drafts (all tokens known: see core/speculation.py)
            positions.extend(range(start, end))
            slot_mapping.extend(_slots(block_ids, start, end, block_size))
            token_ids.extend(seq.token_ids[start:])
            token_ids.extend(seq.draft_token_ids[:num_drafts])
        elif end - start == 1:  # a decode (the common row): no ranges or slices
            positions.append(start)
            slot_mapping.append(block_ids[start // block_size] * block_size + start % block_size)
            if start < num_known:
                token_ids.append(seq.token_ids[start])
        else:
            positions.extend(range(start, end))
            slot_mapping.extend(_slots(block_ids, start, end, block_size))
            token_ids.extend(seq.token_ids[start:end])
        if num_other_groups:  # each further group's slots through its own table (a decode's without a range)
            for slots, tables, group_ids in zip(group_slots, group_tables, seq.block_tables[1:], strict=True):
                if end - start == 1:
                    slots.append(group_ids[start // block_size] * block_size + start % block_size)
                else:  # a prompt chunk, or the last known token and its drafts
                    slots.extend(_slots(group_ids, start, end, block_size))
                tables.append(group_ids)
        if end > num_known and not num_drafts:  # its last token is still on the device: the runner reads it there
            batch.fed_back_token_indices.append(len(token_ids))
            batch.fed_back_rows.append(seq.pending_row)
            token_ids.append(0)
        if seq.prompt_logprobs is not None and seq.needs_prompt_logprobs and \
                _score_prompt(seq, start, end, len(token_ids) - (end - start), batch):
            assert scored is not None, "a sequence asks for prompt logprobs in a batch built without `scored`"
            scored.append(seq)
        batch.query_lens.append(end - start)
        batch.context_lens.append(end)
        batch.block_tables.append(block_ids)
        batch.table_epochs.append(seq.table_epoch)
        if linear_states is not None:
            _add_state_slot(seq, start, end, num_drafts, linear_states, batch)
        if seq.pooling is not None:
            batch.pooling.append(_pooling_row(seq, start, end, len(batch.sampling), pooling_slots))
            batch.sampling.append(None)
        elif end - num_drafts == seq.num_tokens:
            if seq.has_penalties and seq.penalty_slot is None:
                _take_penalty_slot(seq, penalty_slots, batch)
            row = row_sampling(seq, eos_token_ids)
            batch.has_token_masks |= row.has_token_mask
            batch.sampling.append(row)
        else:
            batch.sampling.append(None)
    batch.other_groups = [GroupTables(slots, tables) for slots, tables in zip(group_slots, group_tables, strict=True)]
    if any(draft_counts):
        batch.num_draft_tokens = draft_counts
    if any(s.seq.pooling is not None and s.seq.pooling.token_type_ids is not None for s in scheduled):
        batch.token_type_ids = [t for s in scheduled for t in _token_types(s)]
    return batch


def _slots(block_ids: list[int], start: int, end: int, block_size: int) -> range | list[int]:
    """The cache slots of positions [start, end) through a block table: a range per block (one for most verifying
    rows, whose few tokens share a block), not a lookup per position."""
    first = start // block_size
    if (end - 1) // block_size == first:
        offset = (block_ids[first] - first) * block_size  # position p of the block is slot p + offset
        return range(start + offset, end + offset)
    slots: list[int] = []
    for index in range(first, (end - 1) // block_size + 1):
        offset = (block_ids[index] - index) * block_size
        slots.extend(range(max(start, index * block_size) + offset, min(end, (index + 1) * block_size) + offset))
    return slots


def _pooling_row(seq: Sequence, start: int, end: int, row: int, pooling_slots: PenaltySlots | None) -> PoolingRow:
    """A chunked prompt keeps a pooling slot from its first chunk to its finish (or preemption)."""
    starts, ends = start == 0, end == seq.num_prompt_tokens
    if not (starts and ends) and seq.pooling_slot is None:
        assert pooling_slots is not None, "a chunked pooling sequence in a batch built without pooling slots"
        seq.pooling_slot = pooling_slots.allocate()
    return PoolingRow(row, seq.num_prompt_tokens, starts, ends, seq.pooling_slot)


def _add_state_slot(seq: Sequence, start: int, end: int, num_drafts: int, linear_states: LinearStates,
                    batch: Batch) -> None:
    """The row's state slot (taken at its first row), and its snapshot restore and save where it has them; a row
    that verifies drafts saves its state after each token but the last, one after a rejection restores it."""
    if seq.state_slot is None:
        seq.state_slot = linear_states.slots.allocate()
    batch.state_slots.append(seq.state_slot)
    if linear_states.drafts is not None:
        restore = linear_states.drafts.restore_of_row(seq, start)
        if restore is not None:
            batch.state_restores.append((restore, seq.state_slot))
        if num_drafts:
            row = len(batch.query_lens) - 1
            batch.state_saves.extend((row, n, r) for n, r in linear_states.drafts.saves(seq.state_slot, num_drafts))
    if linear_states.snapshots is not None:
        copies = linear_states.snapshots.copies_of_row(seq, start, end)
        if copies.restore is not None:
            batch.state_restores.append((copies.restore, seq.state_slot))
        row = len(batch.query_lens) - 1
        batch.state_saves.extend((row, num_tokens, snapshot) for num_tokens, snapshot in copies.saves)


def _token_types(s: ScheduledSequence) -> list[int]:
    types = s.seq.pooling.token_type_ids if s.seq.pooling is not None else None
    return list(types[s.start : s.end]) if types is not None else [0] * s.num_new_tokens


def _score_prompt(seq: Sequence, start: int, end: int, first_token_index: int, batch: Batch) -> bool:
    """Prompt tokens t in [start + 1, end] whose logprob no launched step computes: the state at t - 1 (flat
    token first_token_index + t - 1 - start) scores them. False when there are none in this chunk."""
    first = max(seq.next_prompt_logprob, start + 1)
    last = min(end, seq.num_prompt_tokens - 1)
    if first > last:
        return False
    batch.prompt_logprobs.append(PromptLogprobsRow(first_token_index + first - 1 - start,
                                                   seq.token_ids[first : last + 1], seq.params.prompt_logprobs or 0))
    seq.next_prompt_logprob = last + 1
    return True


def _take_penalty_slot(seq: Sequence, penalty_slots: PenaltySlots | None, batch: Batch) -> None:
    """Gives the sequence a slot, filled this step from its tokens (all known: see core/penalty_slots.py)."""
    assert penalty_slots is not None, "a penalized sequence in a batch built without penalty slots"
    assert seq.num_pending_tokens == 0, "a penalty slot is filled from known tokens only"
    seq.penalty_slot = penalty_slots.allocate()
    seq.steady_sampling = None  # built before it held this slot
    n = seq.num_prompt_tokens
    batch.penalty_slot_inits.append(PenaltySlotInit(seq.penalty_slot, seq.token_ids[:n], seq.token_ids[n:]))


def row_sampling(seq: Sequence, eos_token_ids: tuple[int, ...]) -> RowSampling:
    params = seq.params
    num_output_tokens = seq.num_output_tokens
    is_steady = params.seed is None and num_output_tokens >= params.min_tokens
    if is_steady and seq.steady_sampling is not None:
        return seq.steady_sampling  # the same every step from here on: built once
    banned: tuple[int, ...] = ()
    if num_output_tokens < params.min_tokens:
        banned = params.stop_token_ids + (() if params.ignore_eos else eos_token_ids)
    penalties = None
    if seq.penalty_slot is not None:
        penalties = Penalties(seq.penalty_slot, params.presence_penalty, params.frequency_penalty,
                              params.repetition_penalty)
    row = RowSampling(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed,
        output_index=num_output_tokens,
        banned_token_ids=banned,
        num_top_logprobs=params.logprobs,
        penalties=penalties,
        logit_bias=seq.logit_bias,
        has_token_mask=params.structured_output is not None,
    )
    if is_steady:
        seq.steady_sampling = row
    return row
