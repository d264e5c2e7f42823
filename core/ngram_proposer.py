"""Prompt lookup (vLLM's `ngram` method): draft tokens copied from the sequence's own past.

The draft is what followed the latest earlier occurrence of the sequence's last n tokens, for the
longest n in [min_n, max_n] that occurs earlier, continued periodically where it reaches the end
(vLLM's stops there); no occurrence, no draft. Each sequence keeps its
tokens in a growing numpy buffer (appended only with the tokens new since its last proposal), and
the match is found with array operations: one comparison over the whole buffer for the last token,
then one per further token over the surviving candidates only.
"""

import numpy as np

from core.sequence import Sequence


class TokenBuffer:
    """A sequence's known tokens as a numpy array, grown in place (doubling) as tokens come."""

    def __init__(self) -> None:
        self.array = np.empty(64, dtype=np.int64)
        self.length = 0

    def sync(self, token_ids: list[int]) -> np.ndarray:
        """The tokens, after appending those of `token_ids` past what the buffer holds."""
        new = len(token_ids) - self.length
        if new > 0:
            if len(token_ids) > len(self.array):
                grown = np.empty(max(2 * len(self.array), len(token_ids)), dtype=np.int64)
                grown[: self.length] = self.array[: self.length]
                self.array = grown
            self.array[self.length : len(token_ids)] = token_ids[self.length :]
            self.length = len(token_ids)
        return self.array[: self.length]


def lookup_draft(tokens: np.ndarray, max_drafts: int, min_n: int, max_n: int) -> np.ndarray:
    """`max_drafts` tokens that followed the latest earlier occurrence of the longest suffix of `tokens` of length
    in [min_n, max_n] (an empty array when none occurs)."""
    num_tokens = len(tokens)
    if num_tokens < 2 or max_drafts < 1:
        return tokens[:0]
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # where an earlier match of the suffix ends
    best_end, n = -1, 1
    while ends.size:
        if n >= min_n:
            best_end = int(ends[-1])
        if n == max_n or n >= num_tokens - 1:
            break
        ends = ends[ends >= n]
        ends = ends[tokens[ends - n] == tokens[num_tokens - 1 - n]]
        n += 1
    if best_end < 0:
        return tokens[:0]
    # What followed the match, repeated where it runs into the end: the match and the suffix are one period
    # apart, so a repetition that reaches the end goes on (a loop gets a full draft, not its last token only).
    period = num_tokens - 1 - best_end
    return tokens[best_end + 1 + np.arange(max_drafts) % period]


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None:
        """Sets each sequence's draft_token_ids (at most its entry of `max_drafts`; maybe none)."""
        for seq, limit in zip(seqs, max_drafts, strict=True):
            if not isinstance(seq.draft_state, TokenBuffer):
                seq.draft_state = TokenBuffer()
            tokens = seq.draft_state.sync(seq.token_ids)
            seq.draft_token_ids = lookup_draft(tokens, limit, self.min_n, self.max_n).tolist()
