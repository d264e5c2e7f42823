"""Prompt lookup (vLLM's `ngram` method): draft tokens copied from the sequence's own past.

The draft is what followed the latest earlier occurrence of the sequence's last n tokens, for the
longest n in [min_n, max_n] that occurs earlier, continued periodically where it reaches the end
(vLLM's stops there); no occurrence, no draft. Each sequence keeps its tokens packed in a growing
buffer of bytes (appended only with the tokens new since its last proposal), and the match is found by
bytes' own reverse search, for the shortest n first (where it never occurred, no longer one did), then from the
longest n down: per sequence a few calls into C, not a dozen array operations.
"""

import struct

from core.sequence import Sequence

_INT32 = "i"
_TOKEN_BYTES = struct.calcsize(_INT32)


class PackedTokens:
    """A sequence's known tokens packed 4 bytes each (native int32: token ids are below 2**31), grown in place as
    tokens come: bytes' own search (C) finds an n-gram's occurrences in one pass, where array operations cost a call
    each per sequence per step."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.length = 0

    def sync(self, token_ids: list[int]) -> bytearray:
        """The tokens, after appending those of `token_ids` past what the buffer holds."""
        if len(token_ids) > self.length:
            # struct, which packs a list faster than array's constructor: a long prompt is packed whole at its
            # sequence's first lookup.
            new = token_ids[self.length :]
            self.data += struct.pack(f"{len(new)}{_INT32}", *new)
            self.length = len(token_ids)
        return self.data


def lookup_draft(token_ids: list[int], max_drafts: int, min_n: int, max_n: int,
                 packed: bytes | bytearray | None = None) -> list[int]:
    """`max_drafts` tokens that followed the latest earlier occurrence of the longest suffix of `token_ids` of length
    in [min_n, max_n] (none when none occurs). `packed`: the same tokens as PackedTokens holds them (else packed
    here)."""
    num_tokens = len(token_ids)
    if num_tokens < 2 or max_drafts < 1:
        return []
    if packed is None:
        packed = PackedTokens().sync(token_ids)
    if min_n > num_tokens - 1:
        return []
    # The shortest suffix first: a longer one occurs only where it does, and in most text the last tokens occur
    # nowhere before, which one scan tells rather than one per length.
    end = _latest_earlier_end(packed, num_tokens, min_n)
    if end is None:
        return []
    for n in range(min(max_n, num_tokens - 1), min_n, -1):
        if (longer_end := _latest_earlier_end(packed, num_tokens, n)) is not None:
            end = longer_end
            break
    # What followed the match, repeated where it runs into the end: the match and the suffix are one period
    # apart, so a repetition that reaches the end goes on (a loop gets a full draft, not its last token only).
    following = token_ids[end + 1 : num_tokens]  # one period
    return (following * (max_drafts // len(following) + 1))[:max_drafts]


def _latest_earlier_end(packed: bytes | bytearray, num_tokens: int, n: int) -> int | None:
    """Where the latest occurrence of the last n tokens ends, among those that end before the last token."""
    pattern = packed[(num_tokens - n) * _TOKEN_BYTES : num_tokens * _TOKEN_BYTES]
    limit = (num_tokens - 1) * _TOKEN_BYTES
    while (found := packed.rfind(pattern, 0, limit)) >= 0:
        if found % _TOKEN_BYTES == 0:  # else a match across token boundaries: search before it
            return found // _TOKEN_BYTES + n - 1
        limit = found + len(pattern) - 1
    return None


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None:
        """Sets each sequence's draft_token_ids (at most its entry of `max_drafts`; maybe none)."""
        for seq, limit in zip(seqs, max_drafts, strict=True):
            seq.draft_token_ids = self.draft(seq, limit)

    def draft(self, seq: Sequence, max_drafts: int) -> list[int]:
        """Up to `max_drafts` tokens to follow the sequence's known ones (maybe none)."""
        if not isinstance(seq.draft_state, PackedTokens):
            seq.draft_state = PackedTokens()
        packed = seq.draft_state.sync(seq.token_ids)
        return lookup_draft(seq.token_ids, max_drafts, self.min_n, self.max_n, packed)
