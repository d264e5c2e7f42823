"""One choice of a response: engine deltas (token ids) in, text deltas with their logprobs out.

Runs on the asyncio side, per request delta. Text that is held back (half a UTF-8 character, or
what may be the start of a stop string) keeps its tokens' logprobs waiting with it, so a stream's
chunks concatenate to exactly the non-streamed choice. A stop string finishes the choice at the
token that completed it; the caller then aborts the sequence in the engine.
"""

from dataclasses import dataclass, field

from core import FinishReason, RequestOutput, SamplingParams
from core.detokenizer import IncrementalDetokenizer, TokenDecoder
from openai_serve.logprobs import TokenLogprob

_FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}


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
    def __init__(self, spec: ChoiceSpec, tokenizer: TokenDecoder) -> None:
        self.spec = spec
        params = spec.params
        self._detokenizer = IncrementalDetokenizer(
            tokenizer, spec.prompt_token_ids, params.stop, skip_special_tokens=params.skip_special_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        self._pending_logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.num_output_tokens = 0
        self.num_cached_prompt_tokens = 0

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_stopped_by_string(self) -> bool:
        return self._detokenizer.is_stopped

    def absorb(self, output: RequestOutput) -> ChoiceDelta | None:
        """This step's tokens; None while everything new is held back (or after the choice finished)."""
        if self.is_finished:
            return None  # tokens the engine made before the abort for a stop string reached it
        self.num_cached_prompt_tokens = output.num_cached_prompt_tokens
        text = self._add_tokens(output)
        if not self.is_finished and output.finish_reason is not None:
            text += self._detokenizer.flush()
            self.finish_reason = _FINISH_REASONS[output.finish_reason]
        if not text and not self.is_finished:
            return None
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        return ChoiceDelta(self.spec.index, text, logprobs, self.finish_reason)

    def _add_tokens(self, output: RequestOutput) -> str:
        pieces = []
        for token_id, logprobs in zip(output.new_token_ids, output.new_logprobs, strict=True):
            offset = len(self._detokenizer.text)
            pieces.append(self._detokenizer.add_tokens([token_id]))
            self.num_output_tokens += 1
            if logprobs is not None:
                self._pending_logprobs.append(TokenLogprob(token_id, logprobs, offset))
            if self._detokenizer.is_stopped:
                self.finish_reason = "stop"
                break
        return "".join(pieces)
