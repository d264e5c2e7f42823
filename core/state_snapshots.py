"""Prefix caching for models with linear-attention layers: their state at block boundaries, kept in snapshot rows
of the runner's state cache (gpu/state_cache.py) and keyed like the KV blocks.

A prefix hit must give the full-attention layers their KV blocks and the linear layers their state at the hit's
end: a hit is the longest run of cached KV blocks whose last block's key has a snapshot. A sequence saves its state
where a later request is likely to resume:
- during its prompt (or a recomputation), at the end of its KV-cache hit when no snapshot served that far (a branch
  point: the shared part of prompts that differ after it, such as a system prompt) and at the last block boundary
  before its last known token (a later turn of the conversation extends it);
- while it decodes, at each block boundary it crosses, keeping only the latest (its output, if the next turn carries
  it over verbatim).
A step saves the state where its row reaches such a boundary, inside the row (the linear layers cut the row there)
or at its end (`Batch.state_saves`), so prompt chunks need not end there. A snapshot is keyed once the block before
its boundary has its prefix-cache key (a prompt's at once; with a pending token a later step), and before the
sequence's blocks are freed (`on_blocks_freed`); until then only its sequence holds the row. Keyed snapshots are
evicted least recently used first when a save needs a row. An admitted sequence's state slot is filled from its hit's
snapshot before its first step's forward (`Batch.state_restores`).

Per sequence at most three rows are held at once (two prompt points, one decode point) before keying; the pool's
size bounds the rest. Invariant at idle: every row is free or keyed, and free + keyed = total.
"""

from collections import OrderedDict, deque
from dataclasses import dataclass

from core.penalty_slots import PenaltySlots
from core.sequence import Sequence


@dataclass(frozen=True)
class RowCopies:
    """A row's snapshot copies: the snapshot row its slot is filled from before the step (None: none), and each
    (tokens of the row computed, snapshot row) the state is saved to at that point of the row."""

    restore: int | None
    saves: list[tuple[int, int]]


class StateSnapshots:
    def __init__(self, num_snapshots: int, first_row: int, block_size: int) -> None:
        """Rows [first_row, first_row + num_snapshots) of the runner's state cache (the sequence slots come first)."""
        self.num_snapshots = num_snapshots
        self.block_size = block_size
        self.free_rows: deque[int] = deque(range(first_row, first_row + num_snapshots))
        self.key_to_row: OrderedDict[bytes, int] = OrderedDict()  # least recently used first

    @property
    def num_keyed(self) -> int:
        return len(self.key_to_row)

    def usable_hit(self, hit_keys: list[bytes]) -> int:
        """How many leading blocks of a KV-cache hit the linear layers can resume after: the most whose last block
        has a snapshot (0: none)."""
        for num_blocks in range(len(hit_keys), 0, -1):
            if hit_keys[num_blocks - 1] in self.key_to_row:
                return num_blocks
        return 0

    def admit(self, seq: Sequence, num_kv_hit_blocks: int, num_used_blocks: int) -> None:
        """Sets the admitted sequence's restore (the snapshot at its hit's end) and the prompt boundaries where it
        saves its state. Call after it holds its hit of `num_used_blocks` blocks (of `num_kv_hit_blocks` cached)."""
        start = num_used_blocks * self.block_size
        if num_used_blocks:
            key = seq.block_keys[num_used_blocks - 1]
            self.key_to_row.move_to_end(key)
            seq.state_restore = (self.key_to_row[key], start)
        last = (seq.num_tokens - 1) // self.block_size * self.block_size
        ends = {num_kv_hit_blocks * self.block_size, last}
        seq.snapshot_ends = tuple(sorted(end for end in ends if end > start))

    def copies_of_row(self, seq: Sequence, start: int, end: int) -> RowCopies:
        """The snapshot a row that computes [start, end) of `seq` restores first, and those it saves on the way."""
        self.key_ready(seq)
        restore = None
        if seq.state_restore is not None:  # kept while the row starts at the hit: a step run again restores again
            row, hit_end = seq.state_restore
            restore = row if start == hit_end else None
            seq.state_restore = seq.state_restore if start == hit_end else None
        saves = []
        is_decode_boundary = end - start == 1 and end >= seq.num_prompt_tokens and end % self.block_size == 0
        if is_decode_boundary:
            self._drop_decode_snapshot(seq)
        boundaries = [e for e in seq.snapshot_ends if start < e <= end]
        for boundary in boundaries + ([end] if is_decode_boundary and end not in boundaries else []):
            row = self._take_row()
            if row is None:
                break
            seq.unkeyed_snapshots.append((boundary, row))
            saves.append((boundary - start, row))
        if is_decode_boundary and saves:
            seq.decode_snapshot_end = end
        self.key_ready(seq)  # a prompt's blocks have their keys already: its snapshots serve from the next step on
        return RowCopies(restore, saves)

    def key_ready(self, seq: Sequence) -> None:
        """Keys the sequence's saved snapshots whose block has its prefix-cache key now."""
        waiting = []
        for end, row in seq.unkeyed_snapshots:
            index = end // self.block_size - 1
            if index >= len(seq.block_keys):
                waiting.append((end, row))
                continue
            key = seq.block_keys[index]
            if key in self.key_to_row:  # an equal prefix saved it already
                self.free_rows.append(row)
            else:
                self.key_to_row[key] = row
        seq.unkeyed_snapshots = waiting

    def on_blocks_freed(self, seq: Sequence, keep_cached: bool) -> None:
        """Before the sequence's blocks (and their keys) go: its snapshots whose block has a key are keyed, or,
        without `keep_cached` (a failed step's state is not to be trusted), those of its blocks are dropped."""
        if keep_cached:
            self.key_ready(seq)
            return
        for key in seq.block_keys:
            row = self.key_to_row.pop(key, None)
            if row is not None:
                self.free_rows.append(row)

    def release(self, seq: Sequence) -> None:
        """A finished or preempted sequence (after `on_blocks_freed`): its keyed snapshots stay for later hits, the
        others are freed."""
        self.free_rows.extend(row for _, row in seq.unkeyed_snapshots)
        seq.unkeyed_snapshots = []
        seq.state_restore = None
        seq.snapshot_ends = ()
        seq.decode_snapshot_end = None

    def _drop_decode_snapshot(self, seq: Sequence) -> None:
        """Frees the sequence's earlier decode snapshot: it keeps the latest only."""
        end = seq.decode_snapshot_end
        if end is None:
            return
        seq.decode_snapshot_end = None
        for index, (pending_end, row) in enumerate(seq.unkeyed_snapshots):
            if pending_end == end:
                del seq.unkeyed_snapshots[index]
                self.free_rows.append(row)
                return
        key = seq.block_keys[end // self.block_size - 1]
        row = self.key_to_row.pop(key, None)
        if row is not None:
            self.free_rows.append(row)

    def _take_row(self) -> int | None:
        if self.free_rows:
            return self.free_rows.popleft()
        if self.key_to_row:
            return self.key_to_row.popitem(last=False)[1]
        return None


@dataclass(frozen=True)
class LinearStates:
    """Where a hybrid model's sequences keep their linear-attention layers' state: a slot of the runner's state cache
    each while they run, and the snapshots that prefix caching resumes from (None: prefix caching off)."""

    slots: PenaltySlots
    snapshots: StateSnapshots | None
    drafts: "DraftStates | None" = None  # speculative decoding's

    def release(self, seq: Sequence) -> None:
        if seq.state_slot is not None:
            self.slots.release(seq.state_slot)
            seq.state_slot = None
        if self.snapshots is not None:
            self.snapshots.release(seq)


@dataclass(frozen=True)
class DraftStates:
    """Speculative decoding on a hybrid model: a step that verifies d drafts advances the linear layers' state over
    all d + 1 tokens of its row, and a rejected draft cannot be taken out of it. So the row saves its state after
    each of its first d tokens, to rows of its own (`max_drafts` per sequence slot, after the slots and snapshots),
    and when a draft is rejected the next row of the sequence restores the state after the last kept one."""

    first_row: int
    max_drafts: int

    def saves(self, slot: int, num_drafts: int) -> list[tuple[int, int]]:
        """(tokens of the row computed, state row) for a row that verifies `num_drafts` drafts."""
        base = self.first_row + slot * self.max_drafts
        return [(j, base + j - 1) for j in range(1, num_drafts + 1)]

    def after_verified(self, seq: Sequence, row_start: int, num_drafts: int) -> None:
        """The row [row_start, row_start + num_drafts + 1) is verified and `seq.num_computed_tokens` counts its kept
        tokens: where fewer than the whole row are, its next row restores the state saved after them."""
        num_kept = seq.num_computed_tokens - row_start
        if seq.state_slot is not None and 0 < num_kept <= num_drafts:
            seq.draft_state_restore = (self.saves(seq.state_slot, num_kept)[-1][1], seq.num_computed_tokens)

    @staticmethod
    def restore_of_row(seq: Sequence, start: int) -> int | None:
        """The state row the sequence's row starting at `start` restores first (kept while rows start there: a step
        run again restores again)."""
        if seq.draft_state_restore is None:
            return None
        row, end = seq.draft_state_restore
        if start != end:
            seq.draft_state_restore = None
            return None
        return row
