"""Finding stop strings in generated text in time linear in the text, whatever their number.

An Aho-Corasick automaton over a request's stop strings: text is fed once, a character at a time,
each step following at most amortized O(1) links, so a thousand stop strings cost what one does
(checking each stop string at every token cost strings x tokens). The automaton is built once per
set of stop strings (cached: clients repeat theirs) and only read afterwards; each request's
position in it is a `StopStringScanner`.

Which stop string ends the text: the first to complete, reading the text a character at a time; of
those that complete at the same character, the longest (it starts first). So the cut depends on the
text alone, never on how it was split into tokens, steps or UTF-8 pieces: a stop string that would
only complete after another one did is never generated. (vLLM takes the first of the request's list
that occurs in the newest text, so its cut can change with the list's order or with how many tokens
a step added.)

The scanner also answers what the detokenizer must hold back: the longest suffix of the text so
far that is the start of some stop string (its current node's depth).
"""

from collections import deque
from collections.abc import Sequence
from functools import lru_cache


class StopStringAutomaton:
    """The trie of the stop strings with failure links. Node 0 is the root (the empty string)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.children: list[dict[str, int]] = [{}]
        self.depth = [0]
        # The longest stop string that is a suffix of the node's string, or None.
        self.match: list[str | None] = [None]
        for stop in stops:
            self._insert(stop)
        self.fail = self._failure_links()

    def _insert(self, stop: str) -> None:
        node = 0
        for char in stop:
            child = self.children[node].get(char)
            if child is None:
                child = len(self.children)
                self.children[node][char] = child
                self.children.append({})
                self.depth.append(self.depth[node] + 1)
                self.match.append(None)
            node = child
        self.match[node] = stop  # a node's own string beats any shorter suffix

    def _failure_links(self) -> list[int]:
        """Each node's longest proper suffix that is also a node, breadth first (shallower nodes first)."""
        fail = [0] * len(self.children)
        queue = deque(self.children[0].values())
        while queue:
            node = queue.popleft()
            for char, child in self.children[node].items():
                queue.append(child)
                link = fail[node]
                while link and char not in self.children[link]:
                    link = fail[link]
                fail[child] = self.children[link].get(char, 0)
                if self.match[child] is None:
                    self.match[child] = self.match[fail[child]]
        return fail

    def step(self, node: int, char: str) -> int:
        children, fail = self.children, self.fail
        while node and char not in children[node]:
            node = fail[node]
        return children[node].get(char, 0)


@lru_cache(maxsize=256)
def compile_stop_strings(stops: tuple[str, ...]) -> StopStringAutomaton:
    return StopStringAutomaton(stops)


class StopStringScanner:
    """One text's position in the automaton of its stop strings."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._automaton = compile_stop_strings(tuple(stops))
        self._node = 0

    def scan(self, text: str) -> tuple[int, str] | None:
        """Feeds `text`; returns the first stop string to complete in it (the longest of those completing at
        that character), with its start relative to `text` (negative when it began in text fed before),
        or None. Once a stop string was found, nothing more is to be fed."""
        automaton, node = self._automaton, self._node
        step, match = automaton.step, automaton.match
        for offset, char in enumerate(text):
            node = step(node, char)
            stop = match[node]
            if stop is not None:
                return offset + 1 - len(stop), stop
        self._node = node
        return None

    def held(self, limit: int) -> int:
        """Length of the longest suffix of the text so far, at most `limit`, that starts some stop string."""
        automaton, node = self._automaton, self._node
        while automaton.depth[node] > limit:
            node = automaton.fail[node]
        return automaton.depth[node]
