"""The loop every tag-reading parser here shares (reasoning, and the tool-call parsers of every format):
text waits in `_pending` until a step of the parser's state machine can settle it.

`feed` adds the new text and runs steps until one must wait for more; a step takes what it settles
out of `_pending` (leaving what might still be the start of a tag) and adds its deltas.
"""

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.tags import split_at_any


class SteppingParser:
    def __init__(self) -> None:
        self._pending = ""  # text not handled yet

    def feed(self, text: str) -> list[MessageDelta]:
        self._pending += text
        deltas: list[MessageDelta] = []
        while self._step(deltas):
            pass
        return deltas

    def _step(self, deltas: list[MessageDelta]) -> bool:
        """Handles what it can of the pending text; False when it must wait for more."""
        raise NotImplementedError

    def _take_pending(self) -> str:
        pending, self._pending = self._pending, ""
        return pending

    def _send_content(self, deltas: list[MessageDelta]) -> bool:
        """A step in a state where all text is content: what is pending goes out as it is."""
        if self._pending:
            deltas.append(MessageDelta(content=self._take_pending()))
        return False

    def _send_content_before(self, tags: tuple[str, ...], deltas: list[MessageDelta]) -> tuple[str, str, str] | None:
        """Content up to the first of `tags` goes out, but for its trailing whitespace (dropped if a call follows
        it, sent if text does) and what may be the start of a tag, which wait. Once a tag is in: (that
        whitespace, the tag, what follows it); the caller takes `_pending` on from there."""
        before, tag, after = split_at_any(self._pending, tags)
        text = before.rstrip()
        if text:
            deltas.append(MessageDelta(content=text))
        if tag is None:
            self._pending = before[len(text):] + after
            return None
        return before[len(text):], tag, after
