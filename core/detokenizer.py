"""Incremental detokenization with stop strings: token ids in, text deltas that are safe to send out.

Invariants:
- A delta never ends in half a UTF-8 character: while the decoded tail ends in U+FFFD (the token
  boundary splits a multi-byte character, as with emoji and CJK in byte-level BPE), it is held.
- A delta never contains text that could be the start of a stop string: the longest suffix that
  is a proper prefix of some stop string is held until the next tokens decide it. Stop strings are
  found by one automaton over all of them (core/stop_strings.py): each character of the output is
  scanned once, however many stop strings there are.
- Once a stop string is found, `text` is cut right before it (or after it, when asked to include
  it) and every later token is ignored. Where stop strings overlap, the first to complete in the
  text wins (core/stop_strings.py), so the cut never depends on where tokens or characters split.

The prefix-offset/read-offset technique: decode a short window of ids twice, with and without the
newest tokens, and emit the difference. The window starts a few prompt tokens back so that
tokenizers which drop a leading space at the start of a sequence (SentencePiece) decode the first
output token as it reads in context. Pure: knows nothing about the engine or asyncio.
"""

from collections.abc import Sequence
from typing import Protocol

from core.stop_strings import StopStringScanner

# How many prompt tokens give the first output token its context (as in vLLM).
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class TokenDecoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns one sequence's generated tokens into text, a delta at a time."""

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_token_ids: Sequence[int],
        stop: Sequence[str] = (),
        *,
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stop = StopStringScanner(stop) if stop else None
        self._include_stop = include_stop_str_in_output
        self._ids = self._prompt_context(prompt_token_ids)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""  # all decoded output text (cut at a stop string once one is found)
        self._num_released = 0  # characters of `_text` already handed out
        self.stop_string: str | None = None  # the stop string that ended the sequence

    @property
    def text(self) -> str:
        """The output text decoded so far, including text that is still held back."""
        return self._text

    @property
    def is_stopped(self) -> bool:
        return self.stop_string is not None

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Adds generated tokens; returns the text that is now safe to send."""
        for token_id in token_ids:
            if self.is_stopped:
                break
            self._append(token_id)
        return self._release(final=self.is_stopped)

    def flush(self) -> str:
        """The sequence ended without a stop string: releases everything still held back."""
        return self._release(final=True)

    def _append(self, token_id: int) -> None:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return  # an incomplete character (or nothing visible yet): wait for more bytes
        search_from = len(self._text)
        self._text += new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._find_stop(search_from)

    def _find_stop(self, search_from: int) -> None:
        """Looks for a stop string ending in the text from `search_from` on (each character is scanned once)."""
        found = self._stop.scan(self._text[search_from:]) if self._stop is not None else None
        if found is not None:
            start, stop = found
            index = search_from + start
            self._text = self._text[: index + len(stop) if self._include_stop else index]
            self.stop_string = stop

    def _release(self, final: bool) -> str:
        if final and not self.is_stopped:
            self._flush_incomplete_tail()
        end = len(self._text) if final else len(self._text) - self._held_stop_prefix()
        delta = self._text[self._num_released : end]
        self._num_released = max(self._num_released, end)
        return delta

    def _flush_incomplete_tail(self) -> None:
        # The sequence ended mid-character: what a full decode would show (U+FFFD included).
        tail = self._decode(self._ids[self._prefix_offset :])
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        if len(tail) > len(prefix_text):
            self._text += tail[len(prefix_text) :]
            self._prefix_offset = self._read_offset = len(self._ids)

    def _held_stop_prefix(self) -> int:
        """Length of the longest unreleased suffix that is a proper prefix of a stop string."""
        if self._stop is None:
            return 0
        return self._stop.held(len(self._text) - self._num_released)

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

    def _prompt_context(self, prompt_token_ids: Sequence[int]) -> list[int]:
        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        # A context that itself ends mid-character would shift the first delta: go without it.
        if _REPLACEMENT_CHAR in self._decode(context):
            return []
        return context
