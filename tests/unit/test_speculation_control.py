"""The draft-length controller against a model of a host-bound engine at batch 1: plain steps cost the host's
time; a step that asks for drafts costs a little more when the proposer has none, and a verification (drafting,
the verifying step and its host sync) when it has. Step times are noisy, with a rare slow step (a garbage
collection), and each request starts with a prefill whose result the first decode step waits for. Requests run
one after another on one controller, as on one engine."""

import random
from dataclasses import dataclass

import pytest

from core.speculation_control import DraftLengthController

PLAIN_S = 1.34e-3
NO_DRAFT_S = 1.42e-3  # proposing found nothing: a plain step, drafting and its host sync
PREFILL_WAIT_S = 1.5e-3
NOISE = 0.05  # lognormal sigma of every step time
SLOW_STEP_CHANCE, SLOW_STEP_FACTOR = 0.01, 3.0


@dataclass
class Workload:
    draft_chance: float  # of a step that asks for drafts finding some
    accept_after: list[float]  # chance that position i is accepted given the positions before it were
    verify_s: float  # a verifying step


# Lookup with little material (summarizing): a third of the steps find a draft, a quarter of those keep one.
LITTLE_MATERIAL = Workload(1 / 3, [0.27, 0.56, 0.52, 0.62], 1.8 * PLAIN_S)
# Lookup with much material (editing code): most steps find a draft and most drafts are kept.
MUCH_MATERIAL = Workload(0.8, [0.8, 0.9, 0.9, 0.9], 1.8 * PLAIN_S)


def run_requests(workload: Workload, seed: int, num_requests: int = 6, num_tokens: int = 256
                 ) -> tuple[list[float], list[list[int]]]:
    """Per request after a short warm-up one: its time over plain decoding's under the same noise, and the draft
    lengths chosen."""
    rng = random.Random(seed)
    controller = DraftLengthController(max_drafts=4)
    ratios, choices = [], []
    for request_tokens in [8] + [num_tokens] * num_requests:
        # The n-th step's noise, whatever it runs: plain decoding's steps take the same.
        factors = [rng.lognormvariate(0, NOISE) * (SLOW_STEP_FACTOR if rng.random() < SLOW_STEP_CHANCE else 1.0)
                   for _ in range(request_tokens)]
        controller.observe_step(0, 0, 0.01)  # the prefill
        seconds, made, chosen = 0.0, 0, []
        while made < request_tokens:
            noise = factors[len(chosen)]
            k = controller.choose(1)
            chosen.append(k)
            accepted = [0] * k
            if k and rng.random() < workload.draft_chance:
                while sum(accepted) < k and rng.random() < workload.accept_after[sum(accepted)]:
                    accepted[sum(accepted)] = 1
                step_s = noise * workload.verify_s
            else:
                step_s = noise * (PLAIN_S if k == 0 else NO_DRAFT_S)
            step_s += PREFILL_WAIT_S if made == 0 else 0.0
            controller.observe_step(1, k, step_s)
            if k:
                controller.observe_acceptance(1, accepted)
            seconds += step_s
            made += 1 + sum(accepted)
        ratios.append(seconds / (PLAIN_S * sum(factors) + PREFILL_WAIT_S))
        choices.append(chosen)
    return ratios[1:], choices[1:]


@pytest.mark.parametrize("seed", range(5))
def test_with_little_material_it_settles_on_plain_decoding_and_loses_under_two_percent(seed: int) -> None:
    ratios, choices = run_requests(LITTLE_MATERIAL, seed)
    assert sum(ratios) / len(ratios) <= 1.015, ratios
    assert max(ratios) <= 1.03, ratios
    last = choices[-1]
    assert last.count(0) >= 0.9 * len(last), last  # the rest: refreshes of the figures of drafting


@pytest.mark.parametrize("seed", range(5))
def test_with_much_material_it_keeps_drafting(seed: int) -> None:
    ratios, choices = run_requests(MUCH_MATERIAL, seed)
    assert sum(ratios) / len(ratios) <= 1 / 1.6, ratios  # always four drafts would make about 1.9 times the tokens
    last = choices[-1]
    assert last.count(0) <= 0.05 * len(last), last


def settled_on_plain_decoding() -> DraftLengthController:
    controller = DraftLengthController(max_drafts=1, refresh_steps=1000)
    for _ in range(20):
        k = controller.choose(1)
        controller.observe_step(1, k, 1.0 if k == 0 else 1.8)
        if k:
            controller.observe_acceptance(1, [0])
    assert controller.choose(1) == 0
    return controller


def test_a_stray_slow_plain_step_does_not_make_plain_decoding_look_slower() -> None:
    controller = settled_on_plain_decoding()
    controller.observe_step(1, 0, 10.0)  # a garbage collection, say
    assert controller.choose(1) == 0


def test_the_step_after_a_prefill_is_not_measured() -> None:
    controller = DraftLengthController(max_drafts=1, num_tries=1)
    controller.observe_step(0, 0, 0.5)  # a prefill
    controller.observe_step(1, 0, 3.0)  # waits for the prefill's result: not counted
    assert controller.choose(1) == 0  # still untried
    controller.observe_step(1, 0, 1.0)
    assert controller.choose(1) == 1


def test_an_early_lucky_acceptance_weighs_no_more_than_the_later_ones() -> None:
    controller = DraftLengthController(max_drafts=1)
    for accepted in [1] + [0] * 9:
        controller.observe_acceptance(1, [accepted])
    assert controller.expected_tokens(1) == pytest.approx(1.1)
