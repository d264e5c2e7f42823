"""Matching a pattern against text that is still arriving: a match, or whether more text could still
make one (the `regex` package's partial matching). Patterns used here end in a literal or a
lookahead, so the match found on part of a text is the match found on all of it: a stream and a
response in full read the same calls.
"""

from enum import Enum

import regex

MAX_HEAD_CHARS = 256  # what opens a call (its tags and name) must be complete within this many characters


class Found(Enum):
    WAIT = "wait"  # no match yet, but more text could make one
    NONE = "none"  # no text that follows can make one


def find(text: str, position: int, pattern: regex.Pattern[str], limit: int | None = None) -> "regex.Match[str] | Found":
    """The pattern's match at `position` (within `limit` characters of it, when given)."""
    end = len(text) if limit is None else min(len(text), position + limit)
    match = pattern.match(text, position, end, partial=True)
    if match is None:
        return Found.NONE
    if not match.partial:
        return match
    return Found.WAIT if end == len(text) else Found.NONE
