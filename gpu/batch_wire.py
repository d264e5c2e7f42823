"""How a step's batch travels from the engine to its tensor-parallel workers: packed once, sent to each.

Every rank runs the model on the batch, so every rank needs its inputs: token ids, positions, slots,
lengths, block tables, which rows are sampled, where fed-back tokens go, which prompt tokens are
scored. Only rank 0 samples, so only rank 0 gets the sampled rows' `RowSampling`, the penalty slots to
fill and whether token masks follow (`encode_mask`, after the launch). The per-token and per-row lists
travel as numpy arrays (pickled as raw bytes: no per-integer work on the worker's side), the block tables
flat with each row's length (`PackedBlockTables`, which the runner writes to the device as they are).
Packing the block tables costs the engine what writing them costs a runner in one process (one
np.fromiter over the ids), so that host work is not done twice. Further KV-cache groups' slots and block tables
travel the same way. Fields added to `Batch` travel to rank 0 as they are.

Ranks other than 0 get a placeholder `RowSampling` on each sampled row: they only read which rows
are sampled (to compute those rows' share of the logits), never how.
"""

import pickle
from dataclasses import replace

import numpy as np

from gpu.batch import Batch, GroupTables, RowSampling, TokenMask
from gpu.host_to_device import pack_block_tables

_NOT_SAMPLED_HERE = RowSampling()  # ranks other than 0 never sample: only the row's presence matters
_INT_LISTS = ("token_ids", "positions", "slot_mapping", "query_lens", "context_lens", "fed_back_token_indices",
              "fed_back_rows")


def encode(batch: Batch) -> tuple[bytes, bytes]:
    """(rank 0's message, every other rank's)."""
    arrays = {name: np.asarray(getattr(batch, name), dtype=np.int64) for name in _INT_LISTS}
    groups = [GroupTables(np.asarray(g.slot_mapping, dtype=np.int64), pack_block_tables(g.block_tables))
              for g in batch.other_groups]
    packed = replace(batch, block_tables=pack_block_tables(batch.block_tables), other_groups=groups, **arrays)
    others = replace(packed, sampling=[None if row is None else _NOT_SAMPLED_HERE for row in batch.sampling],
                     penalty_slot_inits=[], has_token_masks=False)
    return _dumps(packed), _dumps(others)


def decode(message: bytes) -> Batch:
    """The batch as the engine built it (block tables packed); `sampling` is a placeholder on ranks but 0."""
    batch = pickle.loads(message)
    groups = [replace(g, slot_mapping=g.slot_mapping.tolist()) for g in batch.other_groups]
    return replace(batch, other_groups=groups, **{name: getattr(batch, name).tolist() for name in _INT_LISTS})


def encode_mask(token_mask: TokenMask) -> bytes:
    return _dumps(token_mask)


def decode_mask(message: bytes) -> TokenMask:
    return pickle.loads(message)


def _dumps(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
