"""Flattens one step's scheduled sequences into the runner's plain `Batch`.

This is the only place that turns sequences into positions, cache slots and sampling rows, so it
is testable without a device.
"""

from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from gpu.batch import Batch, RowSampling


def build_batch(scheduled: list[ScheduledSequence], block_size: int, eos_token_ids: tuple[int, ...]) -> Batch:
    batch = Batch(token_ids=[], positions=[], slot_mapping=[], query_lens=[], context_lens=[], block_tables=[])
    for s in scheduled:
        seq = s.seq
        positions = range(s.start, s.end)
        batch.token_ids.extend(seq.token_ids[s.start : s.end])
        if s.end > len(seq.token_ids):  # its last token is still on the device: the runner reads it there
            batch.fed_back_token_indices.append(len(batch.token_ids))
            batch.fed_back_rows.append(seq.pending_row)
            batch.token_ids.append(0)
        batch.positions.extend(positions)
        block_ids = seq.block_ids
        batch.slot_mapping.extend(block_ids[p // block_size] * block_size + p % block_size for p in positions)
        batch.query_lens.append(s.num_new_tokens)
        batch.context_lens.append(s.end)
        batch.block_tables.append(block_ids)
        batch.sampling.append(row_sampling(seq, eos_token_ids) if s.end == seq.num_tokens else None)
    return batch


def row_sampling(seq: Sequence, eos_token_ids: tuple[int, ...]) -> RowSampling:
    params = seq.params
    banned: tuple[int, ...] = ()
    if seq.num_output_tokens < params.min_tokens:
        banned = params.stop_token_ids + (() if params.ignore_eos else eos_token_ids)
    return RowSampling(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed,
        output_index=seq.num_output_tokens,
        banned_token_ids=banned,
        num_top_logprobs=params.logprobs,
    )
