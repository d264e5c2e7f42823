"""Which tokens of which sequences run in the next step, within a token budget.

One rule, in the style of vLLM V1: every scheduled sequence gets tokens so its computed tokens
catch up with its known tokens, up to `max_num_batched_tokens` per step. Running sequences go
first, decodes before unfinished prefills, so a long prompt is prefilled in chunks over several
steps while others keep decoding; waiting sequences are admitted from what is left, their
prefix-cache hits skipped. When blocks run out, the most recently admitted unscheduled running
sequence is preempted: its blocks are freed and it goes back to the front of the waiting queue.
A running sequence with draft tokens (speculative decoding) is given them too, as far as the budget
goes: its blocks cover them, and the engine gives back those of rejected drafts.

One departure, off by default (`decode_hold_ms` 0): with a hold, while prompt tokens wait, a step
leaves out the sequences that are decoding (their stream has begun, one token to compute) and
spends the whole budget on prompts, as SGLang's default schedule does; once sequences have been
held that long, one step schedules everyone as above and the hold may begin again. In a burst of
prompts the last first token comes sooner (no step pays for the running rows' K/V reads), at the
cost of a gap of up to the hold in every running stream.
"""

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from core.block_manager import BlockManager
from core.config import SchedulerConfig
from core.sequence import Sequence, SequenceStatus
from core.state_snapshots import StateSnapshots


class ScheduledSequence(NamedTuple):  # a tuple: built for every row of every step, so cheaply
    seq: Sequence
    start: int  # the sequence's computed tokens when scheduled: this step computes [start, start + num_new)
    num_new_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens

    @classmethod
    def of(cls, seq: Sequence, num_new_tokens: int) -> "ScheduledSequence":
        return cls(seq, seq.num_computed_tokens, num_new_tokens)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)  # from the waiting queue, this step

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 clock: Callable[[], float] = time.monotonic, snapshots: StateSnapshots | None = None) -> None:
        """`snapshots`: a hybrid model's linear-attention state snapshots, which bound its prefix hits."""
        self.config = config
        self.block_manager = block_manager
        self.snapshots = snapshots
        self._clock = clock  # seconds; a test's own clock
        self._decodes_held_since: float | None = None  # the clock when the current hold began
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        self.num_prefix_hit_tokens = 0
        self.num_prefix_queried_tokens = 0  # tokens looked up in the prefix cache, at every admission
        self._num_admissions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def has_prompt_work(self) -> bool:
        """Whether the next step may carry prompt tokens: a waiting sequence with room to be admitted, or a running
        one whose prompt (or recomputation) is not done."""
        return ((bool(self.waiting) and len(self.running) < self.config.max_num_seqs)
                or any(not _is_decoding(s) for s in self.running))

    def finish(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Removes a finished or aborted sequence wherever it is and frees its blocks (`keep_cached`:
        its full blocks stay in the prefix cache)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if self.snapshots is not None:
            self.snapshots.on_blocks_freed(seq, keep_cached)
        self.block_manager.free(seq, keep_cached)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        # Not ready: a sequence whose last token is on its way, or a pooled one whose last chunk was launched.
        ready = [s for s in self.running if not s.is_last_token_pending and s.num_tokens > s.num_computed_tokens]
        if self._may_hold_decodes(ready):
            self._schedule_into(out, [s for s in ready if not _is_decoding(s)])
            if out.scheduled:  # prompts filled the step: the decoding rows wait
                if self._decodes_held_since is None:
                    self._decodes_held_since = self._clock()
                return out
            # No prompt fitted (any preempted for want of blocks are waiting again): everyone else runs.
            ready = [s for s in ready if s.status is SequenceStatus.RUNNING]
        self._decodes_held_since = None
        self._schedule_into(out, ready)
        return out

    def _may_hold_decodes(self, ready: list[Sequence]) -> bool:
        hold_s = self.config.decode_hold_ms / 1000
        if not hold_s or not any(_is_decoding(s) for s in ready):
            return False
        if self._decodes_held_since is not None and self._clock() - self._decodes_held_since >= hold_s:
            return False
        return bool(self.waiting) or any(not _is_decoding(s) for s in ready)

    def _schedule_into(self, out: SchedulerOutput, ready: list[Sequence]) -> None:
        budget = self._schedule_running(out, ready, self.config.max_num_batched_tokens)
        if not out.preempted:
            self._schedule_waiting(out, budget)

    def _schedule_running(self, out: SchedulerOutput, ready: list[Sequence], budget: int) -> int:
        pending = deque(sorted(ready, key=lambda s: (s.num_uncomputed_tokens > 1, s.admission_order)))
        while pending and budget > 0:
            seq = pending.popleft()
            num_new = min(seq.num_uncomputed_tokens + len(seq.draft_token_ids), budget)
            while not self.block_manager.can_append(seq, num_new):
                victim = max(chain(pending, [seq]), key=lambda s: s.admission_order)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
                pending.remove(victim)
            else:
                if seq.draft_token_ids:  # the budget may leave room for some of them only
                    del seq.draft_token_ids[max(0, num_new - seq.num_uncomputed_tokens):]
                self.block_manager.allocate(seq, num_new)
                out.scheduled.append(ScheduledSequence.of(seq, num_new))
                budget -= num_new
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending_tokens:
                break  # preempted while its last token was on the way; admitted once it has arrived
            hit = (self.block_manager.no_hit() if seq.needs_prompt_logprobs or seq.pools_every_token
                   else self.block_manager.match_prefix(seq))
            num_kv_hit_blocks = hit.num_blocks
            if self.snapshots is not None:  # the hit ends where the linear layers' state was saved
                hit = hit.leading(self.snapshots.usable_hit(hit.keys))
            num_new = min(seq.num_tokens - hit.num_blocks * self.block_manager.block_size, budget)
            if seq.must_run_whole and num_new < seq.num_tokens:
                break  # an encoder's prompt waits for a step with room for all of it
            if not self.block_manager.can_admit(seq, hit, num_new):
                break
            self.waiting.popleft()
            self.block_manager.admit(seq, hit)
            if self.snapshots is not None:
                self.snapshots.admit(seq, num_kv_hit_blocks, hit.num_blocks)
            if seq.num_output_tokens == 0:
                seq.num_cached_prompt_tokens = seq.num_computed_tokens
            self.num_prefix_hit_tokens += seq.num_computed_tokens
            self.num_prefix_queried_tokens += seq.num_tokens
            self.block_manager.allocate(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            seq.admission_order = self._num_admissions
            self._num_admissions += 1
            self.running.append(seq)
            out.admitted.append(seq)
            out.scheduled.append(ScheduledSequence.of(seq, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.draft_token_ids = []
        seq.draft_state = None  # a draft model's K/V goes with the blocks
        if self.snapshots is not None:
            self.snapshots.on_blocks_freed(seq, keep_cached=True)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1


def _is_decoding(seq: Sequence) -> bool:
    """Its stream has begun and only its last token is to compute (not a prompt, nor a recomputation)."""
    return seq.num_uncomputed_tokens == 1 and seq.num_output_tokens > 0
