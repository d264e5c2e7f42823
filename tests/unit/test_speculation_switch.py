"""The switch that allows speculation per batch-size bucket by the engine's whole output rate in each mode
(core/speculation_switch.py), fed synthetic steps; and the engine feeding it the tokens it books."""

import pytest

from core.llm import LLM
from core.sampling_params import SamplingParams
from core.speculation import Speculation
from core.speculation_switch import SpeculationSwitch
from core.speculative_config import SpeculativeConfig
from core.tiny_model import tiny_model_dir

TOKENS_A_STEP = 10


def _epoch(switch: SpeculationSwitch, batch_size: int, rates: dict[bool, float]) -> bool:
    """Runs one epoch at `batch_size` whose steps book tokens at the rate of the mode the switch chose; that mode."""
    allowed = switch.allows(batch_size)
    for _ in range(switch.epoch_steps):
        assert switch.allows(batch_size) == allowed, "a mode holds for its epoch"
        switch.observe_step(TOKENS_A_STEP / rates[allowed], TOKENS_A_STEP)
    return allowed


def test_allowed_is_measured_first_then_plain_then_the_faster_is_taken() -> None:
    switch = SpeculationSwitch()
    rates = {True: 900.0, False: 1000.0}
    assert [_epoch(switch, 64, rates) for _ in range(2)] == [True, False]
    assert switch.rate(64, allowed=True) == pytest.approx(900.0)
    assert switch.rate(64, allowed=False) == pytest.approx(1000.0)
    assert _epoch(switch, 64, rates) is False
    rates = {True: 1500.0, False: 1000.0}
    switch = SpeculationSwitch()
    assert [_epoch(switch, 2, rates) for _ in range(3)] == [True, False, True]


def test_one_sequence_always_lets_the_controller_choose() -> None:
    switch = SpeculationSwitch()
    assert all(_epoch(switch, 1, {True: 900.0, False: 1000.0}) for _ in range(5))
    assert switch.rate(1, allowed=True) is None and switch.rate(1, allowed=False) is None


@pytest.mark.parametrize("shortfall", [0.05, 0.2])
def test_the_slower_mode_is_measured_again_as_its_shortfall_allows(shortfall: float) -> None:
    switch = SpeculationSwitch()
    rates = {True: 1000.0 * (1 - shortfall), False: 1000.0}
    modes = [_epoch(switch, 64, rates) for _ in range(400)]
    explored = sum(modes[2:])
    # Each exploration costs an epoch's shortfall: within the share of the time, and spaced by shortfall / share.
    assert explored * shortfall <= switch.exploration_share * 400
    assert explored == pytest.approx(398 / (shortfall / switch.exploration_share + 1), rel=0.2)
    assert switch.rate(64, allowed=True) == pytest.approx(rates[True])


def test_a_mode_that_became_faster_takes_over() -> None:
    switch = SpeculationSwitch()
    for _ in range(20):
        _epoch(switch, 16, {True: 900.0, False: 1000.0})
    modes = [_epoch(switch, 16, {True: 1200.0, False: 1000.0}) for _ in range(30)]
    assert sum(modes[-10:]) >= 9, "once measured again, the faster mode is taken (plain only measured again)"


def test_an_epochs_settling_steps_are_not_counted() -> None:
    switch = SpeculationSwitch(epoch_steps=10, settling_steps=2)
    assert switch.allows(4)
    for i in range(10):
        switch.observe_step(100.0 if i < 2 else 0.01, 1000 if i < 2 else 10)  # the first two book the steps' before
    assert switch.rate(4, allowed=True) == pytest.approx(1000.0)


def test_buckets_are_measured_apart_and_an_epoch_cut_short_is_dropped() -> None:
    switch = SpeculationSwitch(epoch_steps=10, settling_steps=0)
    assert switch.allows(64)
    for _ in range(3):
        switch.observe_step(0.01, 10)
    assert switch.allows(200), "a new bucket's epoch starts verifying allowed"
    assert switch.rate(64, allowed=True) is None, "three steps of ten tell nothing"
    for _ in range(10):
        switch.observe_step(0.02, 10)
    assert switch.rate(256, allowed=True) == pytest.approx(500.0)
    assert switch.allows(256) is False, "then that bucket measures plain decoding"
    assert switch.allows(64) is True, "the other bucket starts again"


def test_the_switch_holds_the_controllers_choice_back_in_plain_epochs() -> None:
    speculation = Speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=2), max_model_len=64)
    assert speculation.switch is not None
    chosen = []
    for _ in range(3 * speculation.switch.epoch_steps):
        chosen.append(speculation.choose(2, lambda: False))
        speculation.observe_step(2, chosen[-1], 0.01 if chosen[-1] else 0.001, 2)
    epoch = speculation.switch.epoch_steps
    assert any(chosen[:epoch]), "the first epoch lets the controller verify"
    assert not any(chosen[epoch : 2 * epoch]), "the second decodes plainly"
    assert not any(chosen[2 * epoch :]), "plain decoding measured ten times faster stays"
    fixed = Speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=2, adaptive=False), max_model_len=64)
    assert fixed.switch is None and fixed.choose(1, lambda: False) == 2


def test_the_engine_gives_the_switch_the_tokens_it_books() -> None:
    llm = LLM(str(tiny_model_dir()), speculative_config={"method": "ngram", "num_speculative_tokens": 2},
              dtype="float32", enforce_eager=True)
    engine = llm.engine
    switch = engine.speculation.switch
    switch.epoch_steps, switch.settling_steps = 8, 0
    observed: list[int] = []
    observe = switch.observe_step
    switch.observe_step = lambda seconds, num_tokens: (observed.append(num_tokens), observe(seconds, num_tokens))[1]
    outputs = llm.generate([[1, 2, 3, 1, 2, 3, 1, 2]] * 3, SamplingParams(max_tokens=40, temperature=0.0))
    generated = sum(len(o.token_ids) for o in outputs)
    # Every step but the last is timed (its time runs to the next step's start); its tokens are the rest.
    assert 0 < generated - sum(observed) <= 3 * (1 + 2)
    assert switch.rate(3, allowed=True) is not None
