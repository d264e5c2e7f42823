"""How many draft tokens a step verifies (k, from 0 to the configured most): the one that is expected to
generate the most tokens per second at the current batch size, from measured figures.

The rule. For a step of B running sequences, with B's bucket b (the next power of two):
  rate(k) = E(k) / T(b, k)
where T(b, k) is the running average (the mean of its first steps, then exponential with weight `time_weight`) of
the wall time of the engine's decode steps at bucket b that verified up to k drafts per sequence (k = 0: plain
decode steps, queued asynchronously as without speculation; drafting, the draft verification and the steps' own host
sync are inside the k > 0 figures, which are those of asynchronous steps too where the verifying steps are laid out on
the device: core/device_verification.py), each timed from its start to the next step's start: what the host does between
steps (a server sends every row's tokens to its front end) runs while the device works on a plain step, and with the
device idle after a verifying one, so a time that ended with the step would favour verifying steps most where there
are most rows; and E(k) = 1 + r_0 + ... + r_{k-1} is the expected tokens a decoding sequence gets from such a step,
where r_i is the running average, per decoding sequence of a step that offered i + 1 or more drafts, of the drafts
accepted at position i: it folds in how many sequences can take drafts (not the penalized or constrained ones), how
often the proposer has one, and how often the target agrees. It is the mean of its first samples, then a running
average that follows the last few (`acceptance_weight`): acceptance changes with the text within a reply (a passage
copied, then new text), and a slow average keeps a length chosen for the passage before. A step with prompt tokens
after decoding steps of one sequence starts that mean again: the figures were that one reply's, and the next reply
(or the two sequences from then on) is another text, which the old reply's tail would stand for until several of its
own samples outweighed it.

Entering verification costs more than its steps: the first verifying step waits for the device work the step
before it left in flight (a plain step's, or a prompt's, which is larger), and only then does its own; the
controller measures that excess, per bucket and per kind of step it follows (plain or prompt), as the first
verifying step's time beyond its arm's average, less what a plain step would have paid after the same kind of step
(after a prompt a plain step waits too). Entered from a step that did not verify, a draft length's time is charged
that excess spread over the run it can expect before the next prompt breaks it, in tokens: a step of k drafts pays
the share E(k) / R of it, where R is the bucket's running average of the tokens a decoding sequence got between two
prompts (expected ones: 1 a plain step, E(k) a verifying one). Runs are counted in tokens, not steps, because
requests end, and new ones bring their prompts, after so many tokens: verifying steps, which give more tokens a
step, make the runs as counted in steps shorter, not the work between prompts. Under a steady stream of new
requests, runs are short and verification is entered often, so it must win by more. Where verification ends before
the prompt does (acceptance falls, and plain decoding is chosen again: one reply alone, whose copied passages come and
go), an entry is paid for each verifying run, so R is then the bucket's running average of the tokens a verifying
run gave (from its entry to its first plain step or prompt) where that is shorter.
Leaving it costs too: a step with prompt tokens after a verifying step is laid out once that step's result is back,
with the device idle, where after a plain step the host lays it out while the device works (where a plain step laid
out on the device comes between, the prompt waits a step instead). The controller measures
that excess as well, per bucket, as the running average of the time of the steps with prompt tokens that follow a
verifying step beyond that of those that follow a plain one, and charges it to every draft length spread over the run
as the entry. While only runs that end verifying have been seen, steps from the one expected to end a run on are
plain, so that a prompt comes after one; a run that goes past twice that length (a longer request than those seen,
as after a short first one) is chosen for by rate again.
Leaving it for plain decoding costs too: the first plain step books the verifying one (the device idle meanwhile) and
the second waits for the first's device work, launched late (where that first plain step is laid out on the device,
core/device_verification.py, neither waits, and the measured excess is what remains of it). The controller measures what
the two take beyond two plain steps' average, per bucket, and while verifying charges plain decoding that figure spread
over the run as the entry; from plain decoding it charges the verifying lengths that figure beside the entry, spread
alike: a verifying run entered is left again, so the way back is part of the way in (else one draft accepted among
plain steps' lookups would start runs of a step or two, each paying the way back for a fraction of a token). A refresh
of a draft length from plain decoding pays both.

Choosing: plain decoding is measured first (the baseline), then the longest draft length; any other untried length is
tried only while its most hopeful rate (its time taken on the line between plain decoding's and the longest's, which
is never more than a real verifying step's, whose fixed cost every length pays) could beat the best measured one: a
batch where verifying is far too slow is not made to try every length. Once measured, the best rate is taken.
A losing arm is measured again (the least recently measured one, run until one of its steps is measured, below) so
that figures follow changing workloads (acceptance drifts with the text), at most once every `refresh_steps` decode
steps of a bucket and no more often than keeps its cost within `exploration_share` of the bucket's time: a refresh
costs the tokens its steps give up against the best arm's rate, plus the entry into verification where it verifies.
Where verifying is cheap (one sequence) that allows a refresh every `refresh_steps`; where entering it makes the
device drain a step of hundreds of rows, refreshes come far apart.
A step's time enters its arm's average at most `max_step_growth` times that average: one slow step (a garbage
collection, a burst of another process) would otherwise make an arm look slow for as long as it is not chosen (a
losing arm is measured again only at refreshes), and for plain decoding that would keep speculation on where it
loses. A lasting change of cost still comes through, by that factor a step. What a verifying step takes beyond the
cap still counts, in a slower running average of its own (weight `tail_weight`) added to the arm's: its slow steps
are its own (it waits for its own result, so what delays the host delays it), and their share of its time is part of
what it costs, while one of them alone moves the figure little.
Not measured in the arms' averages: steps with prompt tokens (prefill: their time says nothing about decoding; they
get no drafts), and the steps after one as after a change of k; the first step after a change of k, which pays for the
step the previous k left in flight (a verifying step waits for it; its excess is the entry cost above) or for none (a
plain step after a verifying one returns before its result is waited for); and the second plain step after a
verifying one, which waits for the first one's device work, launched late: only from the third do plain steps overlap
as they do in a run of them.

Never losing: k = 0 is always an arm, measured like the others, so speculation is chosen only where its
measured rate, entry included, beats plain decoding; what exploration costs shrinks as refreshes keep losing.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

_UNTRIED_ACCEPTANCE = 1.0  # an untried position is assumed to accept: it gets tried, then measured


def _no_prompt_work() -> bool:
    return False


_PLAIN, _PROMPT = 0, -1  # kinds of step that verification can be entered from (a verifying step's kind is its k)


@dataclass
class _Arm:
    seconds: float | None = None  # running average of a step's wall time
    last_step: int = -1  # the bucket's step count when last measured
    num_samples: int = 0  # steps measured
    tail_seconds: float = 0.0  # running average of the time its steps took beyond the cap (verifying arms)

    def cost(self) -> float | None:
        return None if self.seconds is None else self.seconds + self.tail_seconds


@dataclass
class _Bucket:
    arms: list[_Arm]
    num_steps: int = 0
    num_steps_since_refresh: int = 0
    refreshing: int | None = None  # the arm being measured again
    num_refresh_steps_left: int = 0
    # Running averages of a first step's time beyond its arm's average, by (kind of step before, verifying or not).
    entry_excess: dict[tuple[int, bool], float] = field(default_factory=dict)
    # Running averages of the time of a step with prompt tokens after one of this bucket's, by whether that verified.
    prompt_seconds: dict[bool, float] = field(default_factory=dict)
    run_tokens: float | None = None  # running average of the tokens a decoding sequence gets between prompts
    # Running average of what the first two plain steps after a verifying one take beyond two plain steps' average.
    leave_seconds: float | None = None
    # Running average of the tokens a decoding sequence got from a verifying run (its entry to a plain step or prompt).
    verifying_run_tokens: float | None = None

    def entry_seconds(self, previous_kind: int) -> float:
        """What entering verification after a step of `previous_kind` costs beyond the verifying steps' own time."""
        verifying = self.entry_excess.get((previous_kind, True))
        if verifying is None:
            return 0.0
        return max(0.0, verifying - self.entry_excess.get((previous_kind, False), 0.0))

    def round_trip_seconds(self, previous_kind: int) -> float:
        """What a verifying run entered after a step of `previous_kind` costs beyond its steps' own time: the entry
        and the way back to plain decoding."""
        return self.entry_seconds(previous_kind) + (self.leave_seconds or 0.0)

    def exit_seconds(self) -> float:
        """What a step with prompt tokens costs after a verifying step beyond its cost after a plain one."""
        if len(self.prompt_seconds) < 2:
            return 0.0
        return max(0.0, self.prompt_seconds[True] - self.prompt_seconds[False])


@dataclass
class DraftLengthController:
    max_drafts: int
    refresh_steps: int = 100
    exploration_share: float = 0.01  # of a bucket's time that refreshing losing arms may cost
    time_weight: float = 0.2  # of a new step time in the running average
    acceptance_weight: float = 0.2  # of a new sample of acceptance in the running averages, past the first few
    max_step_growth: float = 1.5  # a step's time enters its arm's average at most this multiple of it
    tail_weight: float = 0.05  # of a verifying step's time beyond that cap in its arm's average of such time
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _acceptance: list[float | None] = field(default_factory=list)  # r_i, per draft position
    _num_acceptance_samples: list[int] = field(default_factory=list)  # steps that measured each r_i
    _previous_kind: int = 0  # the last step observed: its draft length, or -1 for one with prompt tokens
    _num_same: int = 0  # steps observed in a row of that kind, the last one included
    _run_tokens: float = 0.0  # tokens a decoding sequence is expected to have got since the last prompt step
    _verifying_run_tokens: float = 0.0  # those it is expected to have got since verification was entered
    _last_batch_size: int = 0  # the last decode step's
    _leave_excess: float | None = None  # the first plain step after a verifying one: its time beyond plain's average

    def __post_init__(self) -> None:
        self._acceptance = [None] * self.max_drafts
        self._num_acceptance_samples = [0] * self.max_drafts

    def choose(self, batch_size: int, has_prompt_work: Callable[[], bool] = _no_prompt_work) -> int:
        """The draft length for the next step of `batch_size` running sequences; where `has_prompt_work()` (the step
        may carry prompt tokens) none: what drafts would gain or cost beside a prompt is not measured, and the step
        stays asynchronous as without speculation."""
        if has_prompt_work():
            return 0
        bucket = self._bucket(batch_size)
        arms = bucket.arms
        for k in (0, self.max_drafts):
            if arms[k].seconds is None:
                return k
        rates = self._rates(bucket)
        best = max((k for k in range(len(arms)) if arms[k].seconds is not None), key=lambda k: rates[k])
        hopeful = [k for k in range(len(arms)) if arms[k].seconds is None and rates[k] > rates[best]]
        if hopeful:
            return hopeful[0]
        if bucket.refreshing is None and bucket.num_steps_since_refresh >= self.refresh_steps:
            losing = [k for k, arm in enumerate(arms) if arm.seconds is not None and k != best]
            if losing:
                k = min(losing, key=lambda k: arms[k].last_step)
                spacing = self._refresh_seconds(bucket, k, rates) / (self.exploration_share * arms[best].cost())  # type: ignore[operator]
                if bucket.num_steps_since_refresh >= spacing:
                    bucket.num_steps_since_refresh = 0
                    bucket.refreshing = k
                    bucket.num_refresh_steps_left = _unmeasured_steps(k) + 1
        if bucket.refreshing is not None:
            bucket.num_refresh_steps_left -= 1
            k = bucket.refreshing
            if not bucket.num_refresh_steps_left:
                bucket.refreshing = None
            return k
        if best and bucket.prompt_seconds.keys() == {True} and bucket.run_tokens is not None and (
                bucket.run_tokens <= self._run_tokens + self.expected_tokens(best) + 0.5 < 2 * bucket.run_tokens):
            return 0  # the exit is unmeasured while every run ends verifying: this run is expected to end about here
        return best

    def acceptance_matters(self, batch_size: int) -> bool:
        """Whether what drafts accept can change the choice at this batch size: not where every draft length would
        lose to plain decoding with all its drafts accepted (its time measured, or an untried one's most hopeful),
        until a refresh measures the lengths again."""
        bucket = self._buckets.get(_bucket_key(batch_size))
        if bucket is None or bucket.arms[0].seconds is None or bucket.arms[self.max_drafts].seconds is None:
            return True
        plain = self._seconds(bucket, 0)
        return any((1 + k) * plain > self._seconds(bucket, k) for k in range(1, self.max_drafts + 1))

    def expected_tokens(self, num_drafts: int) -> float:
        """E(k): tokens a sequence is expected to get from a step that offers it k drafts."""
        return 1.0 + sum(_UNTRIED_ACCEPTANCE if r is None else r for r in self._acceptance[:num_drafts])

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        """A decode step of `batch_size` sequences, run with draft length `num_drafts`; `batch_size` 0: a step with
        prompt tokens, not measured, after which steps wait for its device work as after a change of draft length."""
        kind = num_drafts if batch_size else _PROMPT
        previous = self._previous_kind
        self._num_same = self._num_same + 1 if kind == previous else 1
        self._previous_kind = kind
        if not batch_size:
            if self._last_batch_size == 1:  # acceptance measured one reply's text: a new one's is averaged afresh
                self._num_acceptance_samples = [0] * self.max_drafts
            if self._last_batch_size:  # the bucket of the run that the prompt ends
                last = self._bucket(self._last_batch_size)
                if previous >= _PLAIN:
                    verified = previous > _PLAIN
                    last.prompt_seconds[verified] = _averaged(last.prompt_seconds.get(verified), seconds,
                                                              self.time_weight)
                if self._run_tokens:
                    last.run_tokens = _averaged(last.run_tokens, self._run_tokens, self.time_weight)
                if previous > _PLAIN:
                    self._end_verifying_run(last)
            self._run_tokens = 0.0
            return
        tokens = self.expected_tokens(num_drafts)
        self._run_tokens += tokens
        self._last_batch_size = batch_size
        bucket = self._bucket(batch_size)
        if num_drafts:
            self._verifying_run_tokens += tokens
        elif previous > _PLAIN:
            self._end_verifying_run(bucket)
        arm = bucket.arms[num_drafts]
        # An entry (a verifying step after a plain one or a prompt), or a plain step after a prompt (what entering
        # from a prompt is weighed against): its time beyond its arm's average.
        excess = None if arm.seconds is None else seconds - arm.cost()  # type: ignore[operator]
        if excess is not None and self._num_same == 1 and (
                num_drafts > 0 and previous <= _PLAIN or num_drafts == 0 and previous == _PROMPT):
            key = (previous, num_drafts > 0)
            bucket.entry_excess[key] = _averaged(bucket.entry_excess.get(key), excess, self.time_weight)
        # Leaving for plain decoding: the first plain step books the verifying one (the device idle meanwhile), the
        # second waits for the first's device work, launched late.
        if excess is not None and num_drafts == 0 and self._num_same <= 2:
            if self._num_same == 1:
                self._leave_excess = excess if previous > _PLAIN else None
            elif self._leave_excess is not None:
                bucket.leave_seconds = _averaged(bucket.leave_seconds, self._leave_excess + excess, self.time_weight)
                self._leave_excess = None
        if self._num_same <= _unmeasured_steps(num_drafts):
            return
        if arm.seconds is not None:
            capped = min(seconds, self.max_step_growth * arm.seconds)
            if num_drafts:
                arm.tail_seconds = _averaged(arm.tail_seconds, seconds - capped, self.tail_weight)
            seconds = capped
        arm.num_samples += 1
        weight = max(self.time_weight, 1.0 / arm.num_samples)  # the mean of the first few, then a running average
        arm.seconds = _averaged(arm.seconds, seconds, weight)
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
            self._num_acceptance_samples[i] += 1
            # The mean of the first samples, then a running average: one early step (a reply's opening, which
            # nothing before it predicts) would otherwise set r_i for as long as refreshes take to move it.
            weight = max(self.acceptance_weight, 1.0 / self._num_acceptance_samples[i])
            self._acceptance[i] = _averaged(self._acceptance[i], ratio, weight)

    def _end_verifying_run(self, bucket: _Bucket) -> None:
        """A verifying run ended (a plain step or a prompt came): its tokens go to `bucket`'s running average."""
        if self._verifying_run_tokens:
            bucket.verifying_run_tokens = _averaged(bucket.verifying_run_tokens, self._verifying_run_tokens,
                                                    self.time_weight)
        self._verifying_run_tokens = 0.0

    def _rates(self, bucket: _Bucket) -> list[float]:
        """Per draft length, the tokens per second a sequence is expected to get from its steps at this bucket:
        measured, or for an untried k its most hopeful (the line between plain decoding's time and the longest's);
        verifying lengths are charged the exit from verification spread over the run expected ahead, and the entry and
        the way back to plain decoding where the last step did not verify spread over the verifying run expected (no
        longer than that run). One pass: it runs every decode step."""
        run = max(bucket.run_tokens or 0.0, self._run_tokens)
        exit_seconds, round_trip_seconds, verifying_run = bucket.exit_seconds(), 0.0, run
        plain_seconds = self._seconds(bucket, 0)
        if self._previous_kind <= _PLAIN:
            round_trip_seconds = bucket.round_trip_seconds(self._previous_kind)
            verifying_run = min(run, bucket.verifying_run_tokens or run)
        else:  # leaving verification for plain decoding costs as entering it does, spread alike
            plain_seconds += (bucket.leave_seconds or 0.0) / max(1.0, run)
        rates, tokens = [1.0 / plain_seconds], 1.0
        for k in range(1, self.max_drafts + 1):
            r = self._acceptance[k - 1]
            tokens += _UNTRIED_ACCEPTANCE if r is None else r
            charge = (exit_seconds * tokens / max(tokens, run)
                      + round_trip_seconds * tokens / max(tokens, verifying_run))
            rates.append(tokens / (self._seconds(bucket, k) + charge))
        return rates

    def _seconds(self, bucket: _Bucket, k: int) -> float:
        """A step's cost at draft length k: measured, or for an untried k its most hopeful, the line between plain
        decoding's time and the longest's (both measured first)."""
        seconds = bucket.arms[k].cost()
        if seconds is None:
            plain, longest = bucket.arms[0].cost(), bucket.arms[self.max_drafts].cost()
            assert plain is not None and longest is not None, "plain decoding and the longest k are tried first"
            seconds = plain + (longest - plain) * k / self.max_drafts
        return seconds

    def _refresh_seconds(self, bucket: _Bucket, k: int, rates: list[float]) -> float:
        """What measuring arm k again costs: the tokens its steps give up against the best rate (in the best arm's
        time), and where it verifies, entering verification from plain decoding and leaving it again."""
        arm_seconds = bucket.arms[k].cost()
        assert arm_seconds is not None, "only a measured arm is refreshed"
        lost = (_unmeasured_steps(k) + 1) * arm_seconds * max(0.0, 1.0 - rates[k] / max(rates))
        return lost + (bucket.round_trip_seconds(_PLAIN) if k else 0.0)

    def _bucket(self, batch_size: int) -> _Bucket:
        key = _bucket_key(batch_size)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket([_Arm() for _ in range(self.max_drafts + 1)])
        return bucket


def _averaged(average: float | None, sample: float, weight: float) -> float:
    """A running average after `sample` (of `weight`): the sample itself where there is none yet."""
    return sample if average is None else average + weight * (sample - average)


def _bucket_key(batch_size: int) -> int:
    """A batch size's bucket: the next power of two."""
    return 1 << max(0, batch_size - 1).bit_length()


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

    def acceptance_matters(self, batch_size: int) -> bool:
        return False

    def observe_step(self, batch_size: int, num_drafts: int, seconds: float) -> None:
        pass

    def observe_acceptance(self, num_offered: int, accepted_per_position: list[int]) -> None:
        pass
