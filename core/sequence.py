"""One request's tokens and where it stands: computed tokens, its KV blocks, its finish reason.

`num_computed_tokens` counts tokens whose K/V are in the cache (or queued to be); a sequence is
caught up when it equals `num_tokens`, and then its next step samples a token. A preempted sequence
drops its blocks and computed tokens and recomputes prompt and output alike.

A token sampled by a launched step is pending until that step's results reach the host: it counts
in `num_tokens` (so the next step can be scheduled to compute it, reading it on the device) but is
not yet in `token_ids`. At most one token is pending at a time.
"""

import time
from enum import Enum, auto
from typing import TYPE_CHECKING

import numpy as np

from core.outputs import FinishReason
from core.pooling_params import PoolingParams
from core.sampling_params import SamplingParams
from gpu.batch import LogitBias, RowSampling, TokenLogprobs

if TYPE_CHECKING:
    from xgrammar import GrammarMatcher


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


# An Enum member read from its class goes through a descriptor; `is_finished`, asked of every row several times a
# step, compares with this name instead.
_FINISHED = SequenceStatus.FINISHED


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, max_tokens: int) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)  # known on the host; grows only by resolve_pending_token
        self.num_tokens = len(self.token_ids)  # known and pending: an attribute, read many times a step
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens  # resolved: params.max_tokens or the rest of the context
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_prompt_tokens = 0  # prompt tokens served from the prefix cache at first admission
        # One block table per KV-cache group (core/block_manager.py), empty while it holds no blocks.
        self.block_tables: list[list[int]] = []
        self.table_epoch = 0  # the state its block tables are in (core/block_manager.py sets it at each change)
        self.block_keys: list[bytes] = []  # prefix-cache keys of the full blocks it holds, in order
        # The keys of its first full blocks of known tokens, computed once (tokens are only appended): a waiting
        # sequence is matched against the prefix cache at every step until it is admitted, and again after a preemption.
        self.chain_keys: list[bytes] = []
        self.admission_order = -1  # set by the scheduler each time it admits the sequence
        self.finish_reason: FinishReason | None = None
        self.pending_row = 0  # the pending token's row among its step's sampled rows
        self.is_last_token_pending = False  # the pending token ends it by length: nothing left to schedule
        # Its sampling row once nothing in it changes from step to step (no seed, past min_tokens).
        self.steady_sampling: RowSampling | None = None
        self.has_penalties = params.has_penalties  # read every step: an attribute
        self.penalty_slot: int | None = None  # its entry in the runner's penalty table while it runs (penalized only)
        self.logit_bias = _logit_bias(params)
        self.grammar: GrammarMatcher | None = None  # structured output: set once its grammar is compiled
        # prompt_logprobs: the first prompt token's is None; token t's comes from the state at t - 1.
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None if params.prompt_logprobs is None else [None]
        self.next_prompt_logprob = 1  # the first prompt token whose logprob no launched step computes
        # For the engine's metrics (core/engine_metrics.py): time.monotonic() at these events.
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        # A pooling request (embeddings, scores): prefill only, finished by its last prompt token's step.
        self.pooling: PoolingParams | None = None
        self.pooling_slot: int | None = None  # its entry in the runner's pooling state while chunked
        self.state_slot: int | None = None  # its linear-attention layers' state while it runs (hybrid models only)
        # Its state snapshots (core/state_snapshots.py): the snapshot row its hit restores and the hit's end, the
        # prompt boundaries where it saves, the saves whose block has no key yet, the boundary of its decode snapshot.
        self.state_restore: tuple[int, int] | None = None
        self.snapshot_ends: tuple[int, ...] = ()
        self.unkeyed_snapshots: list[tuple[int, int]] = []  # (boundary, row)
        self.decode_snapshot_end: int | None = None
        # Speculative decoding on a hybrid model (core/state_snapshots.py DraftStates): the state row its next row
        # restores (the state after its last kept draft) and where that row starts.
        self.draft_state_restore: tuple[int, int] | None = None
        self.pools_every_token = False  # mean or CLS pooling: no prompt token may come from the prefix cache
        self.must_run_whole = False  # an encoder's prompt: one step, never chunked
        # Speculative decoding: tokens proposed to follow its last one, verified by the next step (none: a plain
        # decode). Never in num_tokens: the scheduler adds them to the step's new tokens.
        self.draft_token_ids: list[int] = []
        self.draft_state: object | None = None  # the proposer's own record of the sequence (core/ngram_proposer.py)
        # Verifying steps laid out on the device (core/device_verification.py): its slot of the runner's token history
        # while it runs, and how many of its tokens the slot holds as far as the host has booked.
        self.history_slot: int | None = None
        self.num_history_tokens = 0

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt tokens are still to be scored: its prompt must be computed, not taken from the prefix cache."""
        return self.prompt_logprobs is not None and self.next_prompt_logprob < self.num_prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        return self.num_tokens - len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is _FINISHED

    def add_pending_token(self, row: int, is_last: bool) -> None:
        assert self.num_pending_tokens == 0, "a sequence is sampled again before its last token was resolved"
        self.num_tokens += 1
        self.pending_row = row
        self.is_last_token_pending = is_last

    def resolve_pending_token(self, token_id: int) -> None:
        assert self.num_pending_tokens == 1
        self.is_last_token_pending = False
        self.token_ids.append(token_id)

    def append_accepted_tokens(self, token_ids: list[int]) -> None:
        """Draft tokens their verification accepted, after the sampled token of the same step (speculative
        decoding): known on the host at once."""
        assert self.num_pending_tokens == 0
        self.token_ids += token_ids
        self.num_tokens += len(token_ids)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_tables})")


def _logit_bias(params: SamplingParams) -> LogitBias | None:
    """The bias as the runner takes it, built once per sequence."""
    if not params.logit_bias:
        return None
    token_ids, values = zip(*params.logit_bias, strict=True)
    return LogitBias(np.array(token_ids, dtype=np.int64), np.array(values, dtype=np.float32))
