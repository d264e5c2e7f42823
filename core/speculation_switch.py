"""Whether speculation may verify drafts at all, per batch-size bucket: decided by the engine's whole output rate,
measured with verification allowed and without it.

The draft-length controller (core/speculation_control.py) prices each step it chooses and the entry into and exit
from verification around it. What speculation changes beyond those steps is in none of its figures: when new
requests are admitted and how their prompts are batched (a prompt step after a verifying step is laid out once that
step's result is back, so under a steady stream of requests prompts are taken sooner, in more and smaller steps),
and what the server does between steps. Where those costs outweigh what the chosen steps gain, every choice looks
right and the whole is slower. So over spans of steps (epochs) at one bucket, the engine's generated tokens per
second are compared with verification allowed (the controller chooses each step's draft length) and with every step
decoding plainly: one measure of everything, the rule that keeps speculation from being slower than none.

The rule. At one running sequence verification is always allowed (above: nothing else runs beside it). Elsewhere an
epoch is `epoch_steps` steps in one mode while the running sequences stay in one bucket (the next power of two, as the
controller's); its first `settling_steps` are not counted: they book tokens, or wait for device work, that the steps
before the epoch left in flight, and under load the server's own pace settles to the new mode only as the requests
running turn over (a server streaming a token per event for every row, as plain decoding makes it, is slower to take new
requests: more of them wait before the engine sees them, fewer decode; verifying steps, a few tokens per event, drain
that queue), so the first steps after a change would credit one mode with what the other left. Its rate is the tokens
booked during its counted steps over their time, each step timed from its start to the next one's (what the host does
between steps is in it). An epoch whose bucket changes before its end counts if at least half its steps were counted,
else it is dropped. Per bucket and mode, the rate is the mean of its first epochs, then a running average (weight
`rate_weight`).
Verification allowed is measured first (the controller learns its figures there), then plain decoding; after that
each epoch takes the faster mode, and the slower one is measured again once the bucket's epochs since it last was
reach its shortfall (1 - its rate / the faster's) over `exploration_share`: measuring it costs about an epoch times
its shortfall, so exploring costs that share of the time at most, and modes that differ little (where noise could
make the choice wrong) are compared most often.
"""

from dataclasses import dataclass, field

from core.speculation_control import bucket_key

_PLAIN, _ALLOWED = 0, 1


@dataclass
class _Mode:
    rate: float | None = None  # tokens a second, running average of its epochs'
    num_epochs: int = 0  # epochs measured
    last_epoch: int = 0  # the bucket's epoch count when last measured


@dataclass
class _Bucket:
    modes: tuple[_Mode, _Mode] = field(default_factory=lambda: (_Mode(), _Mode()))
    num_epochs: int = 0

    def next_mode(self, exploration_share: float) -> int:
        plain, allowed = self.modes
        if allowed.rate is None:
            return _ALLOWED
        if plain.rate is None:
            return _PLAIN
        faster = _ALLOWED if allowed.rate >= plain.rate else _PLAIN
        slower = self.modes[1 - faster]
        shortfall = 1.0 - slower.rate / self.modes[faster].rate  # type: ignore[operator]
        return 1 - faster if self.num_epochs - slower.last_epoch >= shortfall / exploration_share else faster


@dataclass
class _Epoch:
    key: int  # its bucket
    mode: int
    num_steps: int = 0  # observed
    num_counted: int = 0
    seconds: float = 0.0
    num_tokens: int = 0


@dataclass
class SpeculationSwitch:
    epoch_steps: int = 200
    settling_steps: int = 100
    exploration_share: float = 0.01
    rate_weight: float = 0.2
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _epoch: _Epoch | None = None

    def allows(self, batch_size: int) -> bool:
        """Whether the next step of `batch_size` running sequences may verify drafts (the controller chooses how many);
        else it decodes plainly."""
        key = bucket_key(batch_size)
        epoch = self._epoch
        if epoch is not None and epoch.key != key:
            self._end(epoch)
            epoch = None
        if key == 1:
            # One sequence: no other request's prompt is batched beside its steps (its own prompt is its start), so
            # the controller's figures are the whole and there is nothing here to weigh.
            return True
        if epoch is None:
            bucket = self._buckets.setdefault(key, _Bucket())
            epoch = self._epoch = _Epoch(key, bucket.next_mode(self.exploration_share))
        return epoch.mode == _ALLOWED

    def observe_step(self, seconds: float, num_tokens: int) -> None:
        """The last step's time (its start to the next one's) and the tokens booked meanwhile."""
        epoch = self._epoch
        if epoch is None:
            return
        epoch.num_steps += 1
        if epoch.num_steps > self.settling_steps:
            epoch.num_counted += 1
            epoch.seconds += seconds
            epoch.num_tokens += num_tokens
        if epoch.num_steps >= self.epoch_steps:
            self._end(epoch)

    def rate(self, batch_size: int, allowed: bool) -> float | None:
        """The measured tokens a second at this batch size's bucket in a mode (None: not measured)."""
        bucket = self._buckets.get(bucket_key(batch_size))
        return None if bucket is None else bucket.modes[_ALLOWED if allowed else _PLAIN].rate

    def _end(self, epoch: _Epoch) -> None:
        self._epoch = None
        if 2 * epoch.num_counted < self.epoch_steps - self.settling_steps or epoch.seconds <= 0.0:
            return  # too short to tell (its bucket changed early)
        bucket = self._buckets[epoch.key]
        mode = bucket.modes[epoch.mode]
        mode.num_epochs += 1
        weight = max(self.rate_weight, 1.0 / mode.num_epochs)  # the mean of the first few, then a running average
        rate = epoch.num_tokens / epoch.seconds
        mode.rate = rate if mode.rate is None else mode.rate + weight * (rate - mode.rate)
        bucket.num_epochs += 1
        mode.last_epoch = bucket.num_epochs

