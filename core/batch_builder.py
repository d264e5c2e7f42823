"""Flattens one step's scheduled sequences into the runner's plain `Batch`.

This is the only place that turns sequences into positions, cache slots and sampling rows, so it
is testable without a device.
"""

from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from gpu.batch import Batch, RowSampling


def build_batch(scheduled: list[ScheduledSequence], block_size: int, eos_token_ids: tuple[int, ...]) -> Batch:
    batch = Batch(token_ids=[], positions=[], slot_mapping=[], query_lens=[], context_lens=[], block_tables=[])
    token_ids, positions, slot_mapping = batch.token_ids, batch.positions, batch.slot_mapping
    for s in scheduled:
        seq, start, end = s.seq, s.start, s.start + s.num_new_tokens
        block_ids = seq.block_ids
        num_known = len(seq.token_ids)
        if end - start == 1:  # a decode (the common row): no ranges or slices
            positions.append(start)
            slot_mapping.append(block_ids[start // block_size] * block_size + start % block_size)
            if start < num_known:
                token_ids.append(seq.token_ids[start])
        else:
            positions.extend(range(start, end))
            slot_mapping.extend(block_ids[p // block_size] * block_size + p % block_size for p in range(start, end))
            token_ids.extend(seq.token_ids[start:end])
        if end > num_known:  # its last token is still on the device: the runner reads it there
            batch.fed_back_token_indices.append(len(token_ids))
            batch.fed_back_rows.append(seq.pending_row)
            token_ids.append(0)
        batch.query_lens.append(end - start)
        batch.context_lens.append(end)
        batch.block_tables.append(block_ids)
        batch.sampling.append(row_sampling(seq, eos_token_ids) if end == seq.num_tokens else None)
    return batch


def row_sampling(seq: Sequence, eos_token_ids: tuple[int, ...]) -> RowSampling:
    params = seq.params
    num_output_tokens = seq.num_output_tokens
    is_steady = params.seed is None and num_output_tokens >= params.min_tokens
    if is_steady and seq.steady_sampling is not None:
        return seq.steady_sampling  # the same every step from here on: built once
    banned: tuple[int, ...] = ()
    if num_output_tokens < params.min_tokens:
        banned = params.stop_token_ids + (() if params.ignore_eos else eos_token_ids)
    row = RowSampling(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed,
        output_index=num_output_tokens,
        banned_token_ids=banned,
        num_top_logprobs=params.logprobs,
    )
    if is_steady:
        seq.steady_sampling = row
    return row
