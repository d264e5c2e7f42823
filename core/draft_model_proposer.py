"""Draft tokens from a second, smaller checkpoint with the target's tokenizer (vLLM's `draft_model`).

The draft model has its own KV cache with the target's block count and block size, addressed through the
target's block tables: a sequence's draft K/V for position p sits in the slot its target K/V for p has. So
the scheduler's blocks serve both, and the slots of a step's draft positions are the ones the scheduler
reserved for its drafts. Each sequence records how many of its positions hold draft K/V (`DraftProgress`);
it starts at 0 at each admission (blocks that came from the prefix cache may hold no draft K/V: the draft
writes its own, the same values wherever another sequence wrote them), and after a verification it is the
accepted prefix the draft model computed. Target and draft each keep one full-attention KV-cache group (the engine
refuses a draft model otherwise): a windowed group's table names a null block before its window, where a draft that
catches up would still write.

Drafting k tokens is k launches of the draft model, greedy: the first computes the draft K/V of the positions before
each sequence's last token that it lacks (catching up: after a verification, the drafts it kept but the last and the
bonus token) and the last token's, in one row a sequence sampled at its end; where those positions exceed a step's
token budget (a long prompt), launches before it compute the rest (nothing sampled). Each later launch feeds back the
token the previous drew, on the device; the host waits once, for all of them. The draft is
one-hot (argmax), so the verification's acceptance rule is exact rejection sampling (core/speculation.py).
"""

from dataclasses import dataclass

from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from gpu.batch import Batch, RowSampling
from gpu.runner import Runner

_GREEDY = RowSampling(temperature=0.0)


@dataclass
class DraftProgress:
    num_computed_tokens: int = 0  # leading positions whose draft K/V is in the draft model's cache


class DraftModelProposer:
    """Drafts from a model run beside the target (here a draft model; core/mtp_proposer.py's head overrides the
    hooks): `lag` trailing positions of each sequence lack the state drafting reads, so drafting starts there."""

    lag = 1  # the first draft is sampled after the sequence's last token
    progress_type: type = DraftProgress

    def __init__(self, runner: Runner, block_size: int, max_num_batched_tokens: int) -> None:
        self.runner = runner
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None:
        """Reserves the drafts (placeholders: `fill` draws them once the scheduler has given them slots)."""
        for seq, limit in zip(seqs, max_drafts, strict=True):
            if not isinstance(seq.draft_state, self.progress_type):
                seq.draft_state = self.progress_type()
            seq.draft_token_ids = [0] * limit

    def fill(self, scheduled: list[ScheduledSequence]) -> None:
        """Draws the drafts of the scheduled rows that verify some: launches that catch the drafter up, then the
        first draft's and each later one's (feeding back the previous draws on the device); the host waits once."""
        rows = [(s.seq, s.end - s.seq.num_tokens) for s in scheduled if s.end > s.seq.num_tokens]
        if not rows:
            return
        seqs = [seq for seq, _ in rows]
        *catch_up, first = self._first_draft_batches(seqs)
        for batch in catch_up:
            self.runner.launch(batch)
        launched = [self.runner.launch(first)]
        previous = seqs
        for i in range(1, max(n for _, n in rows)):
            current = [seq for seq, n in rows if n > i]
            launched.append(self.runner.launch(self._next_batch(current, previous, i)))
            previous = current
        drawn: dict[Sequence, list[int]] = {seq: [] for seq in seqs}
        for i, pending in enumerate(launched):
            current = [seq for seq, n in rows if n > i]
            for seq, token_id in zip(current, pending.result().token_ids, strict=True):  # type: ignore[union-attr]
                drawn[seq].append(token_id)
        for seq, num_drafts in rows:
            seq.draft_token_ids = drawn[seq][:num_drafts]

    def on_verified(self, seq: Sequence, num_tokens_before: int, num_drafts: int) -> None:
        """After a verification: the draft K/V that holds is that of the accepted tokens it computed (the last
        token before the step and the first num_drafts - 1 drafts)."""
        assert isinstance(seq.draft_state, DraftProgress)
        seq.draft_state.num_computed_tokens = min(seq.num_computed_tokens, num_tokens_before + num_drafts - 1)

    def _first_draft_batches(self, seqs: list[Sequence]) -> list[Batch]:
        """The launches that catch the drafter up and draw the first drafts (module doc): the last has a row a
        sequence, in order, ending at the position its first draft is sampled at and starting as early as the step's
        token budget allows (earlier sequences first); the positions before those rows that lack drafter state go to
        launches before it, in batches of at most the budget, nothing sampled."""
        room = self.max_num_batched_tokens - len(seqs)  # the last launch's, beside a sampled position a sequence
        last, starts = self._new_batch(), []
        for seq in seqs:
            first, sampled_at = seq.draft_state.num_computed_tokens, seq.num_tokens - self.lag  # type: ignore[union-attr]
            start = min(max(first, sampled_at - room), sampled_at)
            room -= sampled_at - start
            self._add_positions(last, seq, start, sampled_at + 1)
            add_row(last, seq, sampled_at + 1 - start, sampled_at + 1)
            starts.append(start)
        return self._catch_up_batches(seqs, starts) + [last]

    def _catch_up_batches(self, seqs: list[Sequence], ends: list[int]) -> list[Batch]:
        """Each sequence's positions without drafter state before its entry of `ends`, in batches of at most a step's
        token budget (a long prompt over several); nothing is sampled."""
        batches, batch = [], self._new_batch()
        for seq, end in zip(seqs, ends, strict=True):
            start = seq.draft_state.num_computed_tokens  # type: ignore[union-attr]
            while start < end:
                room = self.max_num_batched_tokens - len(batch.token_ids)
                if room == 0:
                    batches.append(batch)
                    batch, room = self._new_batch(), self.max_num_batched_tokens
                stop = min(end, start + room)
                self._add_positions(batch, seq, start, stop)
                add_row(batch, seq, stop - start, stop, sampled=False)
                start = stop
        return batches + [batch] if batch.token_ids else batches

    def _next_batch(self, seqs: list[Sequence], previous: list[Sequence], index: int) -> Batch:
        """One token per sequence: the draft the previous launch drew (fed back on the device), at its position."""
        batch = self._fed_back_batch()
        row_of = {seq: row for row, seq in enumerate(previous)}
        for seq in seqs:
            position = seq.num_tokens - self.lag + index
            batch.fed_back_token_indices.append(len(batch.token_ids))
            batch.fed_back_rows.append(row_of[seq])
            batch.token_ids.append(0)
            batch.positions.append(position)
            batch.slot_mapping.append(self._slot(seq, position))
            add_row(batch, seq, 1, position + 1)
        return batch

    def _new_batch(self) -> Batch:
        return empty_batch()

    def _fed_back_batch(self) -> Batch:
        return empty_batch()

    def _add_positions(self, batch: Batch, seq: Sequence, start: int, stop: int) -> None:
        """Positions [start, stop), each on its own token."""
        batch.token_ids.extend(seq.token_ids[start:stop])
        batch.positions.extend(range(start, stop))
        batch.slot_mapping.extend(self._slot(seq, p) for p in range(start, stop))

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_tables[0][position // self.block_size] * self.block_size + position % self.block_size


def empty_batch() -> Batch:
    return Batch(token_ids=[], positions=[], slot_mapping=[], query_lens=[], context_lens=[], block_tables=[])


def add_row(batch: Batch, seq: Sequence, query_len: int, context_len: int, sampled: bool = True) -> None:
    batch.query_lens.append(query_len)
    batch.context_lens.append(context_len)
    batch.block_tables.append(seq.block_tables[0])
    batch.sampling.append(_GREEDY if sampled else None)

