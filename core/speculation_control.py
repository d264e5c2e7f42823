"""How many draft tokens a step verifies (k, from 0 to the configured most): the one that is expected to
generate the most tokens per second at the current batch size, from measured figures.

The rule. For a step of B running sequences, with B's bucket b (the next power of two):
  rate(k) = E(k) / T(b, k)
where T(b, k) is the running average (exponential, weight `time_weight`) of the wall time of the engine's
decode steps at bucket b that verified up to k drafts per sequence (k = 0: plain decode steps, queued
asynchronously as without speculation; drafting, the draft verification and the steps' own host sync are
inside the k > 0 figures), each timed from its start to the next step's start: what the host does between
steps (a server sends every row's tokens to its front end) runs while the device works on a plain step, and
with the device idle after a verifying one, so a time that ended with the step would favour verifying steps
most where there are most rows; and E(k) = 1 + r_0 + ... + r_{k-1} is the expected tokens a decoding sequence
gets from such a step, where r_i is the running average, per decoding sequence of a step that offered i + 1
or more drafts, of the drafts accepted at position i: it folds in how many sequences can take drafts (not
the penalized or constrained ones), how often the proposer has one, and how often the target agrees.

Choosing: an arm (b, k) with no measured time is tried first, smallest k first (k = 0 is the baseline, and
an untried k can only be judged against a measured one); once all are measured, the best rate is taken.
Every `refresh_steps` decode steps at a bucket, the arm measured least recently is run instead until one of its
steps is measured (below), so that figures follow changing workloads (acceptance drifts with the text) at a
bounded cost.
A step's time enters its arm's average at most `max_step_growth` times that average: one slow step (a garbage
collection, a burst of another process) would otherwise make its arm look slow for as long as the arm is not chosen,
and the plain arm, once it loses, is measured again only at refreshes, so one outlier there could keep
speculation on where it loses. A lasting change of cost still comes through, by that factor a step.
Not measured: steps with prompt tokens (prefill: their time says nothing about decoding; they get no drafts), and
the steps after one as after a change of k; the first step after a change of k, which pays for the step the previous
k left in flight (a verifying step waits for it) or for none (a plain step after a verifying one returns before its
result is waited for); and the second plain step after a verifying one, which waits for the first one's device work,
launched late: only from the third do plain steps overlap as they do in a run of them. Measured there, the plain
arm's refreshes cost it the pipeline's refill, and a controller that had chosen speculation kept it where plain
decoding was faster.

Never losing: k = 0 is always an arm, measured like the others, so speculation is chosen only where its
measured rate beats plain decoding; what exploration costs is one step in `refresh_steps` per bucket.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

_UNTRIED_ACCEPTANCE = 1.0  # an untried position is assumed to accept: it gets tried, then measured


def _no_prompt_work() -> bool:
    return False


@dataclass
class _Arm:
    seconds: float | None = None  # running average of a step's wall time
    last_step: int = -1  # the bucket's step count when last measured


@dataclass
class _Bucket:
    arms: list[_Arm]
    num_steps: int = 0
    num_steps_since_refresh: int = 0
    refreshing: int | None = None  # the arm being measured again
    num_refresh_steps_left: int = 0


@dataclass
class DraftLengthController:
    max_drafts: int
    refresh_steps: int = 100
    time_weight: float = 0.2  # of a new step time in the running average
    acceptance_weight: float = 0.05  # of a new step's acceptance in the running averages
    max_step_growth: float = 1.5  # a step's time enters its arm's average at most this multiple of it
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _acceptance: list[float | None] = field(default_factory=list)  # r_i, per draft position
    _previous_kind: int = 0  # the last step observed: its draft length, or -1 for one with prompt tokens
    _num_same: int = 0  # steps observed in a row of that kind, the last one included

    def __post_init__(self) -> None:
        self._acceptance = [None] * self.max_drafts

    def choose(self, batch_size: int, has_prompt_work: Callable[[], bool] = _no_prompt_work) -> int:
        """The draft length for the next step of `batch_size` running sequences; where `has_prompt_work()` (the step
        may carry prompt tokens) none: what drafts would gain or cost beside a prompt is not measured, and the step
        stays asynchronous as without speculation."""
        if has_prompt_work():
            return 0
        bucket = self._bucket(batch_size)
        untried = [k for k, arm in enumerate(bucket.arms) if arm.seconds is None]
        if untried:
            return untried[0]
        if bucket.num_steps_since_refresh >= self.refresh_steps:
            bucket.num_steps_since_refresh = 0
            bucket.refreshing = min(range(len(bucket.arms)), key=lambda k: bucket.arms[k].last_step)
            bucket.num_refresh_steps_left = _unmeasured_steps(bucket.refreshing) + 1
        if bucket.refreshing is not None and bucket.num_refresh_steps_left:
            bucket.num_refresh_steps_left -= 1
            return bucket.refreshing
        return max(range(len(bucket.arms)), key=lambda k: self.expected_tokens(k) / bucket.arms[k].seconds)  # type: ignore[operator]

    def expected_tokens(self, num_drafts: int) -> float:
        """E(k): tokens a sequence is expected to get from a step that offers it k drafts."""
        return 1.0 + sum(_UNTRIED_ACCEPTANCE if r is None else r for r in self._acceptance[:num_drafts])

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        """A decode step of `batch_size` sequences, run with draft length `num_drafts`; `batch_size` 0: a step with
        prompt tokens, not measured, after which steps wait for its device work as after a change of draft length."""
        kind = num_drafts if batch_size else -1
        self._num_same = self._num_same + 1 if kind == self._previous_kind else 1
        self._previous_kind = kind
        if not batch_size or self._num_same <= _unmeasured_steps(num_drafts):
            return
        bucket = self._bucket(batch_size)
        arm = bucket.arms[num_drafts]
        if arm.seconds is not None:
            seconds = min(seconds, self.max_step_growth * arm.seconds)
        arm.seconds = seconds if arm.seconds is None else arm.seconds + self.time_weight * (seconds - arm.seconds)
        arm.last_step = bucket.num_steps
        bucket.num_steps += 1
        bucket.num_steps_since_refresh += 1

    def observe_acceptance(self, num_offered: int, accepted_per_position: list[int]) -> None:
        """A step offered `num_offered` sequences up to len(accepted_per_position) drafts each; entry i counts those
        whose draft at position i was accepted."""
        if not num_offered:
            return
        for i, num_accepted in enumerate(accepted_per_position):
            ratio = num_accepted / num_offered
            r = self._acceptance[i]
            self._acceptance[i] = ratio if r is None else r + self.acceptance_weight * (ratio - r)

    def _bucket(self, batch_size: int) -> _Bucket:
        key = 1 << max(0, batch_size - 1).bit_length()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket([_Arm() for _ in range(self.max_drafts + 1)])
        return bucket


def _unmeasured_steps(num_drafts: int) -> int:
    """The steps at a draft length, after a change to it, whose time is not what the length costs (docstring)."""
    return 2 if num_drafts == 0 else 1


@dataclass
class FixedDraftLength:
    """The same draft length at every step (speculative_config.adaptive false, as vLLM): the controller's
    interface, measuring nothing."""

    num_drafts: int

    def choose(self, batch_size: int, has_prompt_work: Callable[[], bool] = _no_prompt_work) -> int:
        return self.num_drafts  # drafts beside prompts too (not asked: a scan of the running sequences)

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        pass

    def observe_acceptance(self, num_offered: int, accepted_per_position: list[int]) -> None:
        pass
