"""How many draft tokens a step verifies (k, from 0 to the configured most): the one that is expected to
generate the most tokens per second at the current batch size, from measured figures.

The rule. For a step of B running sequences, with B's bucket b (the next power of two):
  rate(k) = E(k) / T(b, k)
where T(b, k) is the time of the engine's decode steps at bucket b that verified up to k drafts per sequence
(k = 0: plain decode steps, queued asynchronously as without speculation; drafting, the draft verification
and the steps' own host sync are inside the k > 0 figures, and so is a step whose proposer had no draft), and
E(k) = 1 + r_0 + ... + r_{k-1} is the expected tokens a decoding sequence gets from such a step, where r_i is
the running average, per decoding sequence of a step that offered i + 1 or more drafts, of the drafts
accepted at position i: it folds in how many sequences can take drafts (not the penalized or constrained
ones), how often the proposer has one, and how often the target agrees.

The figures. T(b, 0) is the median of the last `baseline_window` plain steps: plain steps are alike, and a
stray slow one (a garbage collection, a preempted thread) must not make plain decoding look slower, which
would hold as long as k = 0 is not chosen and so not measured. T(b, k > 0) is the running average of its
steps (the mean of the first 1 / `time_weight`, then exponential): those steps differ by design (drafts or
none, verified or not), and their mean is what the rate needs. The r_i average alike (the mean of the first
1 / `acceptance_weight` observations, then exponential), so that no early step weighs more than a later one.

Choosing: an arm (b, k) with fewer than `num_tries` measured steps is tried first, smallest k first (k = 0
is the baseline, and an untried k can only be judged against a measured one); once all are measured, the
best rate is taken. Every `refresh_steps` decode steps at a bucket, the arm measured least recently is run
for two steps instead, so that figures follow changing workloads (acceptance drifts with the text) at a
bounded cost. Not measured: steps with prompt tokens (prefill: their time says nothing about decoding); the
step after one (it waits for that step's result); and the first step after a change of k, which pays for
the step the previous k left in flight (a verifying step waits for it) or for none (a plain step after a
verifying one returns before its result is waited for).

Never losing: k = 0 is always an arm, measured like the others, so speculation is chosen only where its
measured rate beats plain decoding; what exploration costs is one step in `refresh_steps` per bucket.
"""

import statistics
from dataclasses import dataclass, field

_UNTRIED_ACCEPTANCE = 1.0  # an untried position is assumed to accept: it gets tried, then measured


@dataclass
class _Arm:
    seconds: float | None = None  # T(b, k): module docstring
    num_measured: int = 0
    recent: list[float] = field(default_factory=list)  # k = 0: its last plain steps' times
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
    num_tries: int = 3  # measured steps an arm gets before the rates decide
    baseline_window: int = 9  # plain steps in T(b, 0)'s median
    time_weight: float = 0.2  # of a new step time in T(b, k > 0)'s running average
    acceptance_weight: float = 0.05  # of a new step's acceptance in the running averages
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _acceptance: list[float | None] = field(default_factory=list)  # r_i, per draft position
    _num_observed: list[int] = field(default_factory=list)  # steps in each r_i
    # The draft length of the last step observed; None after a step with prompt tokens (the engine starts without).
    _previous_drafts: int | None = 0

    def __post_init__(self) -> None:
        self._acceptance = [None] * self.max_drafts
        self._num_observed = [0] * self.max_drafts

    def choose(self, batch_size: int) -> int:
        """The draft length for the next decode step of `batch_size` running sequences."""
        bucket = self._bucket(batch_size)
        untried = [k for k, arm in enumerate(bucket.arms) if arm.num_measured < self.num_tries]
        if untried:
            return untried[0]
        if bucket.num_steps_since_refresh >= self.refresh_steps:
            bucket.num_steps_since_refresh = 0
            bucket.refreshing = min(range(len(bucket.arms)), key=lambda k: bucket.arms[k].last_step)
            bucket.num_refresh_steps_left = 2  # its first step is a change of k: not measured
        if bucket.refreshing is not None and bucket.num_refresh_steps_left:
            bucket.num_refresh_steps_left -= 1
            return bucket.refreshing
        return max(range(len(bucket.arms)), key=lambda k: self.expected_tokens(k) / bucket.arms[k].seconds)  # type: ignore[operator]

    def expected_tokens(self, num_drafts: int) -> float:
        """E(k): tokens a sequence is expected to get from a step that offers it k drafts."""
        return 1.0 + sum(_UNTRIED_ACCEPTANCE if r is None else r for r in self._acceptance[:num_drafts])

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        """A step of `batch_size` decoding sequences (0: a step with prompt tokens), run with draft length
        `num_drafts`."""
        previous, self._previous_drafts = self._previous_drafts, (num_drafts if batch_size else None)
        if not batch_size or num_drafts != previous:
            return
        bucket = self._bucket(batch_size)
        arm = bucket.arms[num_drafts]
        arm.num_measured += 1
        if num_drafts:
            arm.seconds = _running_average(arm.seconds, seconds, max(self.time_weight, 1 / arm.num_measured))
        else:
            arm.recent = [*arm.recent[1 - self.baseline_window:], seconds]
            arm.seconds = statistics.median(arm.recent)
        arm.last_step = bucket.num_steps
        bucket.num_steps += 1
        bucket.num_steps_since_refresh += 1

    def observe_acceptance(self, num_offered: int, accepted_per_position: list[int]) -> None:
        """A step offered `num_offered` sequences up to len(accepted_per_position) drafts each; entry i counts those
        whose draft at position i was accepted."""
        if not num_offered:
            return
        for i, num_accepted in enumerate(accepted_per_position):
            self._num_observed[i] += 1
            weight = max(self.acceptance_weight, 1 / self._num_observed[i])
            self._acceptance[i] = _running_average(self._acceptance[i], num_accepted / num_offered, weight)

    def _bucket(self, batch_size: int) -> _Bucket:
        key = 1 << max(0, batch_size - 1).bit_length()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket([_Arm() for _ in range(self.max_drafts + 1)])
        return bucket


def _running_average(average: float | None, value: float, weight: float) -> float:
    return value if average is None else average + weight * (value - average)


@dataclass
class FixedDraftLength:
    """The same draft length at every step (speculative_config.adaptive false, as vLLM): the controller's
    interface, measuring nothing."""

    num_drafts: int

    def choose(self, batch_size: int) -> int:
        return self.num_drafts

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        pass

    def observe_acceptance(self, num_offered: int, accepted_per_position: list[int]) -> None:
        pass
