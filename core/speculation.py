"""Speculative decoding on the engine's side: which sequences get draft tokens, and what their verification
accepted.

A step that verifies drafts is built with every token of its sequences known on the host: the engine
books the step in flight before it proposes, and books the verifying step before the next is scheduled
(the accepted count decides what comes next). Steps without drafts stay asynchronous, and so do prompt lookup's
steps laid out on the device (core/device_verification.py), which draft from the device's own token history.

A sequence is offered drafts when it is decoding (its stream has begun and only its last token is to be
computed) and nothing in its sampling depends on the tokens before each verified position other than
through the model and its grammar: no penalties (their counts would have to include the drafts), past
min_tokens (its banned tokens change with the position). Those sequences decode one token per step,
exactly as without speculation. Drafts never run past max_tokens or the context length. Structured
output: drafts are cut where the grammar refuses one; each verified position is masked by the grammar's
state after the drafts before it, and the matcher takes the kept tokens only (a draft model's or an MTP
head's drafts, drawn after scheduling, are not cut: constrained sequences get none from them).

Prompt lookup's acceptance is measured beyond the drafts that steps verify (`follow_drafts`): at every step, what
the lookup would draft (the most drafts) from a few decoding sequences' known tokens is compared with the tokens they
then generate, each compared draft a sample of what a verifying step would accept from that sequence (none where the
lookup finds nothing or the sequence takes no drafts). For one-hot drafts a draft's chance to be accepted is the
chance that the target samples it, so this is the verifying steps' own measure; the controller learns whether drafts
would pay while it verifies none, and what longer ones would accept while it verifies short ones (other proposers
cost a forward pass to ask: not followed).

Verification (one-hot drafts: a proposer's draft is a token, not a distribution): the target samples at
each verified position as it would one token per step (a seeded row with the output index of that
position); drafts are accepted while they equal the sampled token, and the first sampled token that
differs (or the one after the last draft) is the bonus. For a greedy row this is the argmax chain; for a
random row it is rejection sampling with a one-hot draft distribution q: the draft t is accepted with
probability p(t) (the chance the sample is t), and on rejection the token is a sample from p with t
removed and renormalized, which is max(p - q, 0) normalized. Each token is therefore drawn from the
target's distribution, and a seeded request gets the tokens it gets without speculation.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.draft_model_proposer import DraftModelProposer
from core.mtp_proposer import MtpProposer
from core.ngram_proposer import NgramProposer
from core.scheduler import ScheduledSequence
from core.sequence import Sequence
from core.speculation_control import DraftLengthController, FixedDraftLength
from core.speculative_config import SpeculativeConfig
from core.suffix_proposer import SuffixProposer
from gpu.runner import Runner

if TYPE_CHECKING:
    from core.grammar import Grammars

# Drafts followed at a time: each step opens one for each sequence in turn, up to 4 a sequence (one a step, for its
# drafts' length) and this many in all, so that a step's resolved ones (a quarter, about) make one sample of a few,
# for a lookup each (some microseconds) a step.
MAX_FOLLOWED = 8
FOLLOWED_PER_SEQUENCE = 4


def takes_drafts(seq: Sequence, pending: int = 0) -> bool:
    """Whether a sequence may verify drafts this step (module docstring): decoding, its stream begun, nothing pending
    (but the `pending` tokens a followed draft allows for), no penalties, past min_tokens."""
    return (seq.num_uncomputed_tokens == 1 and seq.num_output_tokens > 0 and seq.num_pending_tokens == pending
            and not seq.has_penalties and seq.num_output_tokens >= seq.params.min_tokens)


@dataclass
class _FollowedDraft:
    """What prompt lookup would draft for a sequence at a step: the tokens from index `start` on are compared with it
    once known."""

    seq: Sequence
    start: int
    drafts: list[int]

    def accepted(self, num_positions: int) -> list[int] | None:
        """Per position, 1 where a verifying step would have accepted the draft there; None until the tokens it
        stands for are known (or the sequence ended)."""
        tokens = self.seq.token_ids
        if len(tokens) < self.start + num_positions and not self.seq.is_finished:
            return None
        accepted = [0] * num_positions
        for i, draft in enumerate(self.drafts):
            if self.start + i >= len(tokens) or tokens[self.start + i] != draft:
                break
            accepted[i] = 1
        return accepted


@dataclass
class SpeculationCounts:
    """vLLM's spec_decode metrics: counters that only grow."""

    num_drafts: int = 0  # verified rows with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)


class Speculation:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft_runner: Runner | None = None,
                 block_size: int = 16, max_num_batched_tokens: int = 8192) -> None:
        """`draft_runner`: the draft model's (method draft_model), whose KV cache has the target's blocks, or the
        target's, built with its draft head (methods mtp and eagle3)."""
        self.config = config
        self.max_model_len = max_model_len
        self.proposer: NgramProposer | SuffixProposer | DraftModelProposer | MtpProposer
        if config.method == "draft_model":
            assert draft_runner is not None, "method draft_model needs the draft model's runner"
            self.proposer = DraftModelProposer(draft_runner, block_size, max_num_batched_tokens)
        elif config.method in ("mtp", "eagle3"):  # a head on the target's hidden states, in the target's runner
            assert draft_runner is not None, f"method {config.method} needs the target's runner"
            self.proposer = MtpProposer(draft_runner, block_size, max_num_batched_tokens)
        elif config.method == "suffix":
            c = config
            self.proposer = SuffixProposer(c.suffix_decoding_max_tree_depth, c.suffix_decoding_max_cached_requests,
                                           c.suffix_decoding_max_spec_factor, c.suffix_decoding_min_token_prob)
        else:
            self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.controller = (DraftLengthController(config.num_speculative_tokens) if config.adaptive
                           else FixedDraftLength(config.num_speculative_tokens))
        self.counts = SpeculationCounts(accepted_per_position=[0] * config.num_speculative_tokens)
        self._num_offered = 0
        self._accepted_at = [0] * config.num_speculative_tokens
        self._followed: list[_FollowedDraft] = []
        self._follows = config.adaptive and isinstance(self.proposer, NgramProposer)
        self._next_followed = 0  # where in the running list the next followed sequence is looked for

    def propose(self, running: list[Sequence], num_drafts: int, grammars: "Grammars | None") -> None:
        """Gives the eligible running sequences up to `num_drafts` draft tokens each (module docstring).
        `grammars`: the engine's, None until a request asked for structured output (then no sequence has one)."""
        seqs, limits = [], []
        num_decoding = 0
        for seq in running:
            num_decoding += seq.num_uncomputed_tokens == 1
            limit = self._draft_limit(seq, num_drafts)
            if limit:
                seqs.append(seq)
                limits.append(limit)
        # Acceptance is measured per decoding sequence, offered drafts or not (penalized, constrained, near their
        # end): the controller weighs the tokens a step brings the whole batch.
        self._num_offered = num_decoding
        self._accepted_at = [0] * num_drafts
        self.proposer.propose(seqs, limits)
        for seq in seqs:
            if seq.grammar is not None and seq.draft_token_ids:  # drafts past what its grammar allows go
                assert grammars is not None, "a sequence with a grammar before the engine built its grammars"
                del seq.draft_token_ids[grammars.grammatical_prefix(seq.grammar, seq.draft_token_ids):]

    def follow_drafts(self, running: list[Sequence]) -> None:
        """Each step: the followed drafts whose tokens are known go to the controller's acceptance as one sample, and
        drafts are looked up for running sequences, taken in turn, while fewer than MAX_FOLLOWED (and
        FOLLOWED_PER_SEQUENCE a sequence) are followed (a sequence's drafts of successive steps overlap, as those of
        successive verifying steps would: module docstring). Not where the controller's choice cannot depend on
        acceptance (a lookup packs a new sequence's prompt first, tens of microseconds for a long one)."""
        if not self._follows or not self.controller.acceptance_matters(len(running)):
            return
        max_drafts = self.config.num_speculative_tokens
        still_followed, num_resolved, accepted_at = [], 0, [0] * max_drafts
        for followed in self._followed:
            accepted = followed.accepted(max_drafts)
            if accepted is None:
                still_followed.append(followed)
            else:
                num_resolved += 1
                accepted_at = [total + a for total, a in zip(accepted_at, accepted, strict=True)]
        self.controller.observe_acceptance(num_resolved, accepted_at)  # one sample of the step's (none: nothing)
        self._followed = still_followed
        first, most = self._next_followed, min(MAX_FOLLOWED, FOLLOWED_PER_SEQUENCE * len(running))
        for offset in range(len(running)):
            if len(self._followed) >= most:
                break
            seq = running[(first + offset) % len(running)]
            if not seq.num_output_tokens:  # decoding sequences only
                continue
            limit = self._draft_limit(seq, max_drafts, pending=seq.num_pending_tokens)
            drafts = self.proposer.draft(seq, limit) if limit else []  # type: ignore[union-attr]
            self._followed.append(_FollowedDraft(seq, len(seq.token_ids), drafts))
            self._next_followed = (first + offset + 1) % len(running)

    def fill(self, scheduled: list[ScheduledSequence]) -> None:
        """Once the step is scheduled: draws the drafts of a proposer that needs their slots (a draft model, an MTP
        head)."""
        if isinstance(self.proposer, DraftModelProposer):  # an MTP head's proposer is one too
            self.proposer.fill(scheduled)

    def on_verified(self, seq: Sequence, num_tokens_before: int, num_drafts: int) -> None:
        """A sequence's verification is booked (its tokens and computed tokens are the accepted ones)."""
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.on_verified(seq, num_tokens_before, num_drafts)

    def on_finished(self, seq: Sequence) -> None:
        if isinstance(self.proposer, SuffixProposer):
            self.proposer.on_finished(seq)

    def _draft_limit(self, seq: Sequence, num_drafts: int, pending: int = 0) -> int:
        """The drafts a sequence may verify; `pending`: its tokens still in flight, which a followed draft's first
        stands for (a verifying step waits for them)."""
        if not takes_drafts(seq, pending):
            return 0
        if seq.grammar is not None and isinstance(self.proposer, DraftModelProposer | MtpProposer):
            return 0  # its drafts come after scheduling, too late to cut them to the grammar
        # The step's own token plus the drafts stay within max_tokens and the context.
        room = min(seq.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1 + pending
        return max(0, min(num_drafts, room))

    def num_accepted(self, sampled: list[int], drafts: list[int]) -> int:
        """How many leading drafts the sampled tokens confirm; counted in the metrics."""
        num_accepted = 0
        for draft, token in zip(drafts, sampled, strict=False):
            if draft != token:
                break
            num_accepted += 1
        if drafts:
            counts = self.counts
            counts.num_drafts += 1
            counts.num_draft_tokens += len(drafts)
            counts.num_accepted_tokens += num_accepted
            for i in range(num_accepted):
                counts.accepted_per_position[i] += 1
                self._accepted_at[i] += 1
        return num_accepted

    def on_device_verified(self, num_drafts: list[int], num_accepted: list[int], max_drafts: int) -> None:
        """A verifying step laid out on the device (core/device_verification.py) is booked: per row, the drafts it
        verified (`max_drafts`, or 0 where the lookup found none) and those it accepted, for the metrics and the
        controller (every row was a decoding row offered drafts)."""
        self._num_offered = len(num_drafts)
        self._accepted_at = [0] * max_drafts
        counts = self.counts
        for drafted, accepted in zip(num_drafts, num_accepted, strict=True):
            if drafted:
                counts.num_drafts += 1
                counts.num_draft_tokens += drafted
                counts.num_accepted_tokens += accepted
                for i in range(accepted):
                    counts.accepted_per_position[i] += 1
                    self._accepted_at[i] += 1

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        """A step's wall time (`batch_size` 0: a step with prompt tokens), and (for a verifying step, booked by now)
        what it accepted."""
        self.controller.observe_step(batch_size, num_drafts, seconds)
        if num_drafts:
            self.controller.observe_acceptance(self._num_offered, self._accepted_at)
            self._num_offered = 0
