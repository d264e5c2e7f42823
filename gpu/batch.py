"""The plain batch description the model runner executes, and what it returns.

`core/` flattens its sequences into a `Batch`; `gpu/` never sees a sequence. One row per sequence
scheduled this step. A row's new tokens are the last `query_len` of its `context_len` tokens: the
runner writes their K/V to `slot_mapping` first, then attends to the whole context through the
row's block table (causal within the new tokens). A model with several KV-cache groups (gpu/kv_cache_groups.py)
has a slot mapping and block tables per group: `slot_mapping` and `block_tables` are group 0's, `other_groups`
holds the others' (empty for a one-group model).
"""

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Penalties:
    """A row's repetition penalties. The runner keeps, per slot, the counts of the row's generated tokens
    and which tokens its prompt holds, on the device; `slot` is the row's entry (core assigns it)."""

    slot: int
    presence: float = 0.0  # OpenAI's: subtracted once from every token generated so far
    frequency: float = 0.0  # OpenAI's: subtracted once per time the token was generated
    repetition: float = 1.0  # transformers'/vLLM's: divides positive, multiplies negative logits of seen tokens

    @property
    def uses_prompt(self) -> bool:
        return self.repetition != 1.0


@dataclass(frozen=True, eq=False)
class LogitBias:
    """Added to the row's logits before anything else (OpenAI's logit_bias)."""

    token_ids: np.ndarray  # [num_biased] int64
    values: np.ndarray  # [num_biased] float32


@dataclass(frozen=True)
class PenaltySlotInit:
    """Fills a penalty slot anew before this step samples: zero counts, then these tokens counted."""

    slot: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]


@dataclass(frozen=True)
class RowSampling:
    """How to pick the next token of one row. Temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    # With a seed the noise depends only on (seed, output_index): the same tokens whatever else
    # is in the batch, and again after a preemption recomputes the sequence.
    seed: int | None = None
    output_index: int = 0
    # Token ids that must not be sampled this step (EOS and stop ids until min_tokens is reached).
    banned_token_ids: tuple[int, ...] = ()
    # How many top alternatives to return with the sampled token's logprob; None: no logprobs.
    num_top_logprobs: int | None = None
    penalties: Penalties | None = None
    logit_bias: LogitBias | None = None
    # The row's allowed tokens come as a bitmask after the launch (structured output): see ModelRunner.
    has_token_mask: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @cached_property  # read every step; a row is not changed once built (steady rows are reused)
    def adjusts_logits(self) -> bool:
        return self.penalties is not None or self.logit_bias is not None or bool(self.banned_token_ids)


@dataclass(frozen=True, eq=False)
class TokenMask:
    """The allowed tokens of some of a step's sampled rows, filled on the host (structured output)."""

    row_indices: list[int]  # among the step's sampled rows
    bitmask: np.ndarray  # [len(row_indices), ceil(vocab / 32)] int32: bit t % 32 of word t // 32 allows token t


@dataclass(frozen=True)
class PromptLogprobsRow:
    """Scores prompt tokens of one row (vLLM's prompt_logprobs): the hidden state at flat token
    `first_token_index + i` gives the logprob of `target_token_ids[i]`, the prompt token after it."""

    first_token_index: int
    target_token_ids: list[int]
    num_top: int


@dataclass(frozen=True)
class PoolingRow:
    """A row whose prompt is pooled (gpu/pooling.py) instead of sampled. A prompt computed in chunks
    carries its pooling state between steps in the runner's pooling slot `slot` (core assigns it)."""

    row: int  # among the batch's rows
    num_prompt_tokens: int
    starts_prompt: bool  # this chunk holds the prompt's first token
    ends_prompt: bool  # this chunk holds its last: the row's pooled output is returned
    slot: int | None = None  # None: the whole prompt is in this step


@dataclass(frozen=True)
class PackedBlockTables:
    """Block tables as one flat array of block ids and each row's length: the form in which they travel
    to tensor-parallel workers (gpu/batch_wire.py), which write them to the device without a Python loop."""

    lengths: np.ndarray  # [num_rows] int64
    block_ids: np.ndarray  # [sum(lengths)] int32, row after row

    def __len__(self) -> int:
        return len(self.lengths)


@dataclass
class GroupTables:
    """A KV-cache group's own cache slots of the batch's tokens and block tables of its rows (group 0's are the
    batch's `slot_mapping` and `block_tables`)."""

    slot_mapping: list[int]  # [num_tokens]
    block_tables: list[list[int]] | PackedBlockTables  # [num_rows][blocks of that row]


@dataclass
class MtpInputs:
    """The hidden states a step of the MTP head reads: per token, the slot of the target's hidden state in the
    runner's hidden-state cache (written at the KV slot of the position that computed it); None: each row's is the
    previous head step's output at its row `fed_back_rows` (a later draft, one token per row)."""

    hidden_slots: list[int] | None


@dataclass
class Batch:
    token_ids: list[int]  # [num_tokens], the new tokens of every row, row after row
    positions: list[int]  # [num_tokens]
    slot_mapping: list[int]  # [num_tokens], cache slot = block_id * block_size + offset
    query_lens: list[int]  # [num_rows]
    context_lens: list[int]  # [num_rows], tokens in the cache once this step's K/V are written
    block_tables: list[list[int]] | PackedBlockTables  # [num_rows][blocks of that row]
    # [num_rows] each row's table epoch (core/block_manager.py: a number that names one state of a sequence's block
    # tables, every group's, and no other), with which a runner rewrites only the rows whose tables changed since
    # it last wrote them; empty: not known (every row is written).
    table_epochs: list[int] = field(default_factory=list)
    # [num_rows]; None for a prefill chunk that ends before the prompt does (nothing to sample).
    sampling: list[RowSampling | None] = field(default_factory=list)
    # Tokens the host does not know yet: token_ids[fed_back_token_indices[i]] (a placeholder) is the
    # token the previously launched step sampled for its sampled row fed_back_rows[i]; the runner
    # reads it on the device, so this step can be queued before that one's results reach the host.
    fed_back_token_indices: list[int] = field(default_factory=list)
    fed_back_rows: list[int] = field(default_factory=list)
    # Penalty slots (re)filled before this step samples: a row's first sample, or its first after a preemption.
    penalty_slot_inits: list[PenaltySlotInit] = field(default_factory=list)
    # Some sampled row has `has_token_mask`: its sampling waits for the masks (ModelRunner.sample_masked).
    has_token_masks: bool = False
    prompt_logprobs: list[PromptLogprobsRow] = field(default_factory=list)
    pooling: list[PoolingRow] = field(default_factory=list)
    # [num_tokens] segment ids of an encoder's token pairs (BERT's token_type_ids); None: all 0.
    token_type_ids: list[int] | None = None
    # KV-cache groups 1, 2, ...: their slots and block tables.
    other_groups: list[GroupTables] = field(default_factory=list)
    # Speculative decoding: [num_rows] the draft tokens at the end of each row's new tokens (0 on most rows); a
    # sampled row with d drafts is sampled at its last d + 1 positions, each position as one sampled row of the
    # result (see sampled_positions). None: no row verifies drafts.
    num_draft_tokens: list[int] | None = None
    # [num_rows] each row's state slot for a model with linear-attention layers (gpu/state_cache.py, core assigns
    # them); empty otherwise, and in the runner's own warm-up steps, whose rows take slots 0, 1, ... from scratch.
    state_slots: list[int] = field(default_factory=list)
    # Snapshots of the linear layers' state (core/state_snapshots.py): (snapshot row, slot) copied before the forward
    # (a prefix hit's), and (row, its tokens computed, snapshot row) where a row's state is saved on the way.
    state_restores: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int, int]] = field(default_factory=list)
    # Speculative decoding's MTP head (core/mtp_proposer.py): set, the step runs the head instead of the model.
    mtp: "MtpInputs | None" = None

    @property
    def num_rows(self) -> int:
        return len(self.query_lens)

    @cached_property  # read several times a step; a batch is not changed once built
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens)

    def sampled_positions(self) -> tuple[list[RowSampling], np.ndarray]:
        """The result's sampled rows and the flat token index of each: one per sampled row, or d + 1 for a row
        verifying d drafts, whose i-th draws output token output_index + i (so a seeded row draws what it would
        draw one token per step)."""
        sampled = [i for i, row in enumerate(self.sampling) if row is not None]
        ends = np.cumsum(self.query_lens)[sampled]  # past each sampled row's last token
        if self.num_draft_tokens is None:
            return [self.sampling[i] for i in sampled], ends - 1  # type: ignore[misc]
        counts = np.asarray(self.num_draft_tokens, dtype=np.int64)[sampled] + 1  # positions per sampled row
        firsts = np.cumsum(counts) - counts  # each row's first entry in the result
        indices = np.arange(int(counts.sum())) + np.repeat(ends - counts - firsts, counts)
        rows: list[RowSampling] = []
        for i, count in zip(sampled, counts.tolist(), strict=True):
            row = self.sampling[i]
            assert row is not None
            rows += [row] * count if row.seed is None else [
                replace(row, output_index=row.output_index + j) if j else row for j in range(count)]
        return rows, indices


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities from the model's raw distribution (before temperature and filters)."""

    logprob: float  # of the sampled token
    rank: int  # 1 for the most likely token
    top_token_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(frozen=True)
class StepResult:
    """One entry per row whose `sampling` was not None, in row order."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    # One list per entry of the batch's `prompt_logprobs`, one entry per target token.
    prompt_logprobs: list[list[TokenLogprobs]] = field(default_factory=list)
    # One float32 vector per pooling row that ends its prompt, in row order (gpu/pooling.py says what it holds).
    pooled: list[np.ndarray] = field(default_factory=list)
    # A verifying step laid out on the device (gpu/device_verification.py), whose token_ids hold k + 1 sampled tokens
    # a row: per row, the drafts it verified (k, or 0 where the lookup found none) and how many it accepted.
    num_drafts: list[int] = field(default_factory=list)
    num_accepted: list[int] = field(default_factory=list)
