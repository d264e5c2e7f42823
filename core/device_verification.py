"""Speculative decoding by prompt lookup with verifying steps laid out on the device (gpu/device_verification.py):
which steps run so, and the blocks and history slots their rows hold.

Such a step is queued before the previous step's tokens reach the host, as a plain decode step is, so the host
books each one a step late; it does not know how many tokens a row has until then. So the rule (`can_lay_out`, the
one place that decides): a step runs so when it is decode only, every running sequence an ordinary decoding row: its
stream begun, only its last token to compute, past min_tokens (no banned tokens), no penalties (their counts would
need the drafts), no grammar, no seed (its noise depends on an output index the host does not know yet), and room in
the context for the longest it can become. It verifies drafts where the controller asks for them (with a prompt due
it may not); a plain step (no drafts) is laid out so after a verifying one still in flight, where the controller
chooses plain decoding or a prompt waits: the way out of verification needs no wait for that step's tokens, and the
plain step's one token a row is pending as any plain step's, so the step after it is laid out on the host at once.
Anything else (a draft model, an MTP head, suffix decoding) keeps the step whose drafts are proposed on the host.

Blocks: a row's step writes up to k + 1 positions after the tokens the host knows, plus the k_prev + 1 the step in
flight may add before it; the host covers that worst case before it launches (`reserve`) and gives back the tail
past what the next step in flight can write once it books a step (core/engine.py). History slots: a sequence takes
one (gpu/token_history.py) at its first such step and fills it with the tokens the device lacks (its prompt, then
those of steps that kept no history); it gives it back when it finishes or is preempted. Entering from a plain step
still in flight, a row's last token is that step's, not booked yet: the device copies it from that step's sampled
tokens, so the entry waits for nothing (a pending token that ends its sequence by length keeps the step on the host).
"""

from core.batch_builder import row_sampling
from core.block_manager import BlockManager
from core.penalty_slots import PenaltySlots
from core.sequence import Sequence
from core.speculation import takes_drafts
from core.speculative_config import SpeculativeConfig
from gpu.device_verification import DeviceVerifyBatch
from gpu.token_history import HistoryFill


class DeviceVerification:
    def __init__(self, config: SpeculativeConfig, block_manager: BlockManager, max_model_len: int,
                 max_num_seqs: int, eos_token_ids: tuple[int, ...]) -> None:
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.slots = PenaltySlots(max_num_seqs)  # the same kind of pool as the penalty slots

    def can_lay_out(self, running: list[Sequence], num_drafts: int, in_flight_drafts: int | None) -> bool:
        """Whether the next step, verifying `num_drafts` drafts a row (0: a plain step), can be laid out on the device
        (the module's rule), given the draft length of such a step still in flight (None: none is)."""
        if not running:
            return False
        bs = self.block_manager.block_size
        num_blocks = 0
        for seq in running:
            covered = self.covered_tokens(seq, num_drafts, in_flight_drafts)
            if not self._is_ordinary_decoding(seq) or covered > self.max_model_len:
                return False
            num_blocks += max(0, -(-covered // bs) - len(seq.block_tables[0]))
        return num_blocks <= self.block_manager.num_free_blocks + self.block_manager.num_evictable_blocks

    @staticmethod
    def covered_tokens(seq: Sequence, num_drafts: int, in_flight_drafts: int | None) -> int:
        """The tokens a row's blocks must cover for a step of `num_drafts` drafts: its known tokens, those the step in
        flight may add, and the step's own drafts (its first position is the last token)."""
        return seq.num_tokens + num_drafts + (0 if in_flight_drafts is None else in_flight_drafts + 1)

    def reserve(self, running: list[Sequence], num_drafts: int, in_flight_drafts: int | None) -> DeviceVerifyBatch:
        """Covers each row's worst case with blocks and gives it a history slot (filled where the device lacks
        tokens); the batch to launch. Only after `can_lay_out` said yes."""
        fills, slots, tables, sampling = [], [], [], []
        max_context_len = 0
        for seq in running:
            covered = self.covered_tokens(seq, num_drafts, in_flight_drafts)
            self.block_manager.allocate(seq, covered - seq.num_computed_tokens)
            if seq.history_slot is None:
                seq.history_slot, seq.num_history_tokens = self.slots.allocate(), 0
            if seq.num_history_tokens != seq.num_tokens:
                fills.append(HistoryFill(seq.history_slot, seq.num_history_tokens,
                                         seq.token_ids[seq.num_history_tokens :],
                                         seq.pending_row if seq.num_pending_tokens else None))
                seq.num_history_tokens = seq.num_tokens
            slots.append(seq.history_slot)
            tables.append(seq.block_tables[0])
            sampling.append(row_sampling(seq, self.eos_token_ids))
            max_context_len = max(max_context_len, covered)
        return DeviceVerifyBatch(slots, tables, sampling, num_drafts, self.config.prompt_lookup_min,
                                 self.config.prompt_lookup_max, max_context_len, fills)

    def release(self, seq: Sequence) -> None:
        """A finished or preempted sequence's slot goes back (a step still in flight may write it: the device runs
        that step before any later one that fills the slot anew)."""
        if seq.history_slot is not None:
            self.slots.release(seq.history_slot)
            seq.history_slot, seq.num_history_tokens = None, 0

    @staticmethod
    def forget_history(seqs: list[Sequence]) -> None:
        """After a launch that failed: what the device's history holds is unknown, so the next such step fills each
        slot anew."""
        for seq in seqs:
            seq.num_history_tokens = 0

    @staticmethod
    def _is_ordinary_decoding(seq: Sequence) -> bool:
        """Its last token may be pending (a plain step in flight sampled it: the device copies it to the history),
        unless that token ends it by length."""
        return (takes_drafts(seq, seq.num_pending_tokens) and not seq.is_last_token_pending and seq.grammar is None
                and seq.params.seed is None and seq.pooling is None)
