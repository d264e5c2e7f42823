"""One choice of a response: the core tracker's text deltas (core/text_tracker.py), as the
response's choice `index` with OpenAI's finish_reason, and merged per choice when a consumer fell
behind. The tracker finishes a choice at a stop string and aborts its sequence in the engine.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core import RequestOutput, SamplingParams
from core.detokenizer import TokenDecoder
from core.text_tracker import TextTracker, TokenLogprob


@dataclass(frozen=True)
class ChoiceDelta:
    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


def merge_deltas(deltas: list[ChoiceDelta]) -> list[ChoiceDelta]:
    """One delta per choice, in the order choices first appear: its texts and logprobs concatenated
    in order, and the last finish_reason (only a choice's last delta has one). What a client reads
    is unchanged: the concatenation of a choice's deltas is the same either way."""
    if len(deltas) == 1:
        return deltas
    by_index: dict[int, list[ChoiceDelta]] = {}
    for delta in deltas:
        by_index.setdefault(delta.index, []).append(delta)
    return [group[0] if len(group) == 1 else _merge(group) for group in by_index.values()]


def _merge(group: list[ChoiceDelta]) -> ChoiceDelta:
    logprobs = [entry for delta in group for entry in delta.logprobs]
    return ChoiceDelta(group[0].index, "".join(d.text for d in group), logprobs, group[-1].finish_reason)


@dataclass(frozen=True)
class ChoiceSpec:
    """What one choice asks of the engine."""

    index: int  # the choice's index in the response
    prompt_index: int  # which prompt it continues (completions take several)
    request_id: str  # in the engine
    prompt_token_ids: list[int]
    params: SamplingParams


class ChoiceDecoder:
    def __init__(self, spec: ChoiceSpec, tokenizer: TokenDecoder, abort: Callable[[str], None]) -> None:
        self.spec = spec
        self.tracker = TextTracker(spec.request_id, tokenizer, spec.prompt_token_ids, spec.params, abort)
        # time.monotonic() when its first token came and when it finished, for logs and metrics.
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.tracker.is_finished

    def absorb(self, output: RequestOutput) -> ChoiceDelta | None:
        """This step's tokens; None while everything new is held back (or after the choice finished)."""
        if self.first_token_time is None and output.new_token_ids:
            self.first_token_time = time.monotonic()
        delta = self.tracker.absorb(output)
        if delta is None:
            return None
        reason = delta.finish_reason
        if reason is not None:
            self.finish_time = time.monotonic()
        return ChoiceDelta(self.spec.index, delta.text, delta.logprobs, None if reason is None else reason.value)
