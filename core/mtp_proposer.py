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

from core.draft_model_proposer import DraftModelProposer, empty_batch
from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from gpu.batch import Batch, MtpInputs


@dataclass
class MtpProgress:
    num_computed_tokens: int = 0  # leading positions whose head K/V is in its cache


class MtpProposer(DraftModelProposer):
    """`runner`: the target's, built with the head (RunnerConfig.mtp_head)."""

    lag = 2  # the head at n - 2 reads token n - 1 and draws the first draft
    progress_type = MtpProgress

    def fill(self, scheduled: list[ScheduledSequence]) -> None:
        super().fill(scheduled)
        for s in scheduled:
            if s.end > s.seq.num_tokens:
                s.seq.draft_state.num_computed_tokens = s.seq.num_tokens - 1  # type: ignore[union-attr]

    def on_verified(self, seq: Sequence, num_tokens_before: int, num_drafts: int) -> None:
        """Nothing: the next drafting recomputes the drafts' positions from the target's hidden states."""

    def _new_batch(self) -> Batch:
        return _empty_mtp_batch()

    def _fed_back_batch(self) -> Batch:
        """The draft and the head's own output of the previous launch are fed back on the device."""
        batch = empty_batch()
        batch.mtp = MtpInputs(hidden_slots=None)
        return batch

    def _add_positions(self, batch: Batch, seq: Sequence, start: int, stop: int) -> None:
        """Positions [start, stop): each reads the next token and the target's hidden state at its own slot."""
        slots = [self._slot(seq, p) for p in range(start, stop)]
        batch.token_ids.extend(seq.token_ids[start + 1 : stop + 1])
        batch.positions.extend(range(start, stop))
        batch.slot_mapping.extend(slots)
        assert batch.mtp is not None and batch.mtp.hidden_slots is not None
        batch.mtp.hidden_slots.extend(slots)


def _empty_mtp_batch() -> Batch:
    batch = empty_batch()
    batch.mtp = MtpInputs(hidden_slots=[])
    return batch
