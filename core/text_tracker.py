"""One request's text as the engine's outputs arrive: token ids in, text deltas with their logprobs
out. The one detokenize-and-stop logic, shared by the offline `LLM` and the server (as vLLM's
OutputProcessor serves both its LLM and AsyncLLM).

Invariants:
- A stop string finishes the request at the token that completed it: later tokens (the engine made
  them before the abort reached it) are ignored, and the tracker aborts the request in the engine
  at once, so its KV blocks are freed in the next step.
- Text that is held back (half a UTF-8 character, or what may be the start of a stop string) keeps
  its tokens' logprobs waiting with it, so the deltas concatenate to exactly the whole text.
- The token that ended a request by EOS or a stop token id adds no text (as in vLLM), unless
  `include_stop_str_in_output`: with `skip_special_tokens` off (which tool-call parsers of formats
  written in special tokens turn off), `<|im_end|>` or `<|call|>` would otherwise end the answer's text.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.detokenizer import IncrementalDetokenizer, TokenDecoder
from core.outputs import FinishReason, RequestOutput
from core.sampling_params import SamplingParams
from gpu.batch import TokenLogprobs


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's logprob, its top alternatives and where its text starts."""

    token_id: int
    logprobs: TokenLogprobs
    text_offset: int


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens whose text this releases
    finish_reason: FinishReason | None = None


class TextTracker:
    def __init__(
        self,
        request_id: str,
        decoder: TokenDecoder,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        abort: Callable[[str], None],
    ) -> None:
        """`abort(request_id)` aborts the request in the engine (called once a stop string ends it)."""
        self.request_id = request_id
        self._detokenizer = IncrementalDetokenizer(
            decoder, prompt_token_ids, params.stop, skip_special_tokens=params.skip_special_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        self._abort = abort
        self._include_stop_token = params.include_stop_str_in_output
        self._pending_logprobs: list[TokenLogprob] = []
        self.token_ids: list[int] = []  # generated, up to the one that completed a stop string
        self.finish_reason: FinishReason | None = None
        self.num_cached_prompt_tokens = 0
        # prompt_logprobs: one per prompt token (the first None), with the request's first output.
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the request (None: it ended otherwise, or goes on)."""
        return self._detokenizer.stop_string

    @property
    def text(self) -> str:
        """The text so far, including what is still held back; all of it once finished."""
        return self._detokenizer.text

    def absorb(self, output: RequestOutput) -> TextDelta | None:
        """One engine output; None while everything new is held back (or after the request finished)."""
        if self.finish_reason is not None:
            return None  # tokens the engine made before the abort for a stop string reached it
        self.num_cached_prompt_tokens = output.num_cached_prompt_tokens
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        text = self._add_tokens(output)
        if self.finish_reason is None and output.finish_reason is not None:
            text += self._detokenizer.flush()
            self.finish_reason = output.finish_reason
        if not text and self.finish_reason is None:
            return None
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        return TextDelta(text, logprobs, self.finish_reason)

    def _add_tokens(self, output: RequestOutput) -> str:
        pieces = []
        detokenizer = self._detokenizer
        stop_index = self._stop_token_index(output)
        for index, (token_id, logprobs) in enumerate(zip(output.new_token_ids, output.new_logprobs, strict=True)):
            offset = len(detokenizer.text)
            if index != stop_index:
                pieces.append(detokenizer.add_tokens([token_id]))
            self.token_ids.append(token_id)
            if logprobs is not None:
                self._pending_logprobs.append(TokenLogprob(token_id, logprobs, offset))
            if detokenizer.is_stopped:
                self.finish_reason = FinishReason.STOP
                self._abort(self.request_id)
                break
        return "".join(pieces)

    def _stop_token_index(self, output: RequestOutput) -> int | None:
        """Where the token that ended the request (EOS or a stop token id) is among the new ones: its text is
        left out. An engine STOP is always such a token (stop strings are found here, not there)."""
        if output.finish_reason is not FinishReason.STOP or self._include_stop_token or not output.new_token_ids:
            return None
        return len(output.new_token_ids) - 1
