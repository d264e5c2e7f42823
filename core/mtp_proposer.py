"""Draft tokens from the target checkpoint's multi-token-prediction head (vLLM's method `mtp`; the heads are
gpu/models/qwen3_next.py's MtpHead and gpu/models/glm4_moe.py's MtpLayer).

The head at position p reads the target's last hidden state at p and token p + 1, and predicts token p + 2. It has
its own KV cache (one attention layer, in the target's full-attention group: its K/V for position p sits in the slot
the target's K/V for p has), and the runner keeps the target's hidden state at each KV slot a target step computed,
so the head can run at any position the target has computed, whichever step computed it.

A sequence records the leading positions whose head K/V is computed from the target's hidden states (`MtpProgress`;
0 at each admission, as a draft model's). A sequence whose last known token n - 1 is still to be computed has its
target hidden states at positions up to n - 2: drafting catches the head up over positions [progress, n - 2) in
launches of at most a step's token budget (nothing sampled), then runs it at n - 2 (reading token n - 1), which draws
draft 1 (greedy); draft i + 1 comes from the head at position n - 2 + i, on draft i and the head's own previous
output in place of the target's hidden state, both fed back on the device. The host waits once, for all of them.
Those later positions' head K/V came from the head's own output, not the target's: the progress stays at n - 1, and
the next drafting recomputes them from the target's hidden states (of the tokens verification kept), as vLLM does.
"""

from dataclasses import dataclass

from core.draft_model_proposer import add_row, draw_drafts, empty_batch, reserve_drafts
from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from gpu.batch import Batch, MtpInputs
from gpu.runner import Runner


@dataclass
class MtpProgress:
    num_computed_tokens: int = 0  # leading positions whose head K/V is in its cache


class MtpProposer:
    def __init__(self, runner: Runner, block_size: int, max_num_batched_tokens: int) -> None:
        """`runner`: the target's, built with the head (RunnerConfig.mtp_head)."""
        self.runner = runner
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None:
        reserve_drafts(seqs, max_drafts, MtpProgress)

    def fill(self, scheduled: list[ScheduledSequence]) -> None:
        """Draws the drafts of the scheduled rows that verify some."""
        rows = [(s.seq, s.end - s.seq.num_tokens) for s in scheduled if s.end > s.seq.num_tokens]
        if not rows:
            return
        seqs = [seq for seq, _ in rows]
        for batch in self._catch_up_batches(seqs):
            self.runner.launch(batch)
        draw_drafts(self.runner, rows, self._first_draft_batch(seqs), self._next_batch)
        for seq in seqs:
            seq.draft_state.num_computed_tokens = seq.num_tokens - 1  # type: ignore[union-attr]

    def _catch_up_batches(self, seqs: list[Sequence]) -> list[Batch]:
        """The head at the positions [progress, n - 2) it lacks, in batches of at most a step's token budget (a long
        prompt over several); nothing is sampled."""
        batches, batch = [], _empty_mtp_batch()
        for seq in seqs:
            start, end = seq.draft_state.num_computed_tokens, seq.num_tokens - 2  # type: ignore[union-attr]
            while start < end:
                room = self.max_num_batched_tokens - len(batch.token_ids)
                if room == 0:
                    batches.append(batch)
                    batch, room = _empty_mtp_batch(), self.max_num_batched_tokens
                stop = min(end, start + room)
                self._add_positions(batch, seq, start, stop)
                add_row(batch, seq, stop - start, stop, sampled=False)
                start = stop
        return batches + [batch] if batch.token_ids else batches

    def _first_draft_batch(self, seqs: list[Sequence]) -> Batch:
        """Each sequence's head at n - 2, on its last known token: it draws the first draft."""
        batch = _empty_mtp_batch()
        for seq in seqs:
            position = seq.num_tokens - 2
            self._add_positions(batch, seq, position, position + 1)
            add_row(batch, seq, 1, position + 1)
        return batch

    def _next_batch(self, seqs: list[Sequence], previous: list[Sequence], index: int) -> Batch:
        """One token per sequence: the draft the previous launch drew and that launch's output, fed back on the
        device, at the next position."""
        batch = Batch(token_ids=[], positions=[], slot_mapping=[], query_lens=[], context_lens=[], block_tables=[],
                      mtp=MtpInputs(hidden_slots=None))
        row_of = {seq: row for row, seq in enumerate(previous)}
        for seq in seqs:
            position = seq.num_tokens - 2 + index
            batch.fed_back_token_indices.append(len(batch.token_ids))
            batch.fed_back_rows.append(row_of[seq])
            batch.token_ids.append(0)
            batch.positions.append(position)
            batch.slot_mapping.append(self._slot(seq, position))
            add_row(batch, seq, 1, position + 1)
        return batch

    def _add_positions(self, batch: Batch, seq: Sequence, start: int, stop: int) -> None:
        """Positions [start, stop): each reads the next token and the target's hidden state at its own slot."""
        slots = [self._slot(seq, p) for p in range(start, stop)]
        batch.token_ids.extend(seq.token_ids[start + 1 : stop + 1])
        batch.positions.extend(range(start, stop))
        batch.slot_mapping.extend(slots)
        assert batch.mtp is not None and batch.mtp.hidden_slots is not None
        batch.mtp.hidden_slots.extend(slots)

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_tables[0][position // self.block_size] * self.block_size + position % self.block_size


def _empty_mtp_batch() -> Batch:
    batch = empty_batch()
    batch.mtp = MtpInputs(hidden_slots=[])
    return batch
