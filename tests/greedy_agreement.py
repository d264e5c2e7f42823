"""The project's rule for two implementations that round differently: their greedy tokens agree except at near-ties.

Where one's greedy tokens first leave the other's, each side's token is in the other's top-5 (asked with
logprobs=5), and that happens in at most 5% of the greedy choices compared: after a divergence the two continue from
different texts, so only the tokens up to it compare.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core import LLMEngine, SamplingParams
from core.outputs import TokenLogprobs

MAX_DIVERGENCE_SHARE = 0.05


class Greedy(Protocol):
    """A request's greedy tokens and their logprobs (a GenerationOutput has both)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def logprobs(self) -> Sequence[TokenLogprobs | None]: ...


@dataclass
class EngineOutput:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)


def generate(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[EngineOutput]:
    """Every prompt to its end on `engine` (one built with a runner of the caller's choosing)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    outputs = {str(i): EngineOutput() for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].token_ids.extend(out.new_token_ids)
            outputs[out.request_id].logprobs.extend(out.new_logprobs)
    return list(outputs.values())


def count_divergences(outputs: Sequence[Greedy], reference: Sequence[Greedy]) -> tuple[int, int]:
    """(divergences, choices compared); asserts that each divergence is a near-tie."""
    num_diverged = num_compared = 0
    for ours, theirs in zip(outputs, reference, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids, strict=False)) if a != b),
                     None)
        if first is None:
            num_compared += len(theirs.token_ids)
            continue
        num_diverged += 1
        num_compared += first + 1
        ours_top, theirs_top = ours.logprobs[first], theirs.logprobs[first]
        assert ours_top is not None and theirs_top is not None, "asked with logprobs=5"
        assert theirs.token_ids[first] in ours_top.top_token_ids
        assert ours.token_ids[first] in theirs_top.top_token_ids
    return num_diverged, num_compared


def assert_diverge_rarely_near_ties(outputs: Sequence[Greedy], reference: Sequence[Greedy]) -> None:
    num_diverged, num_compared = count_divergences(outputs, reference)
    assert num_diverged <= MAX_DIVERGENCE_SHARE * num_compared, f"{num_diverged} divergences in {num_compared} choices"
