"""Suffix decoding (vLLM's `suffix` method, after Arctic Inference's): drafts from the continuations of the
sequence's latest tokens, in its own tokens and in the outputs of earlier requests, by frequency.

For a corpus of tokens (the sequence's own; or the recent requests' outputs, one after another with a
separator that matches nothing), the match is the longest suffix of the sequence, of up to `max_depth`
tokens, that occurs in the corpus; the draft then walks the suffix tree's path of most frequent
continuations: at each step the token that most often follows the occurrences of what is matched so far,
its frequency among them the step's probability, while the product of the probabilities stays at least
`min_token_prob` and the draft is at most `max_spec_factor` times the match length. Of the two drafts
(own tokens, earlier outputs) the one with the larger sum of probabilities is proposed.

The suffix tree is not built: the occurrences of the matched string are positions in a numpy array, found
by narrowing the positions of the last token one preceding token at a time, and a walk step counts their
next tokens. Once a single occurrence is left (a long match mostly has one) the match is extended, and the
walk follows it without array operations: its continuation is the draft. The earlier outputs are one
array with a sorted index of its positions by token (so finding a token's positions is a binary search);
outputs appended since the index was built are scanned directly until they are a quarter of it, then it
is built again. Departure from vLLM: the
cache keeps the outputs of at most `max_cached_requests` requests and at most `MAX_CACHED_TOKENS` tokens,
the most recent; past either it drops the oldest quarter at once.
"""

from collections import Counter, deque

import numpy as np

from core.sequence import Sequence

MAX_CACHED_TOKENS = 1 << 20
_SEPARATOR = -1
_FEW_TOKENS = 64  # continuations counted in Python, not with np.unique
_MAX_GATHERED = 1 << 16  # tokens gathered at once for a loop's further depths or drafts (else one at a time)


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


class OutputCache:
    """The outputs of recent requests as one array, and an index of its positions by token."""

    def __init__(self, max_requests: int, max_tokens: int = MAX_CACHED_TOKENS) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self._outputs: deque[np.ndarray] = deque()
        self._num_tokens = 0
        self.corpus = np.empty(0, dtype=np.int64)
        self._tail: list[np.ndarray] = []  # appended, not yet in `corpus`
        self._order = np.empty(0, dtype=np.int64)  # positions of corpus[:indexed], sorted by token (stable)
        self._sorted = np.empty(0, dtype=np.int64)  # the tokens at those positions

    def add(self, token_ids: list[int]) -> None:
        output = np.asarray([*token_ids, _SEPARATOR], dtype=np.int64)
        self._outputs.append(output)
        self._tail.append(output)
        self._num_tokens += len(output)
        if len(self._outputs) > self.max_requests or self._num_tokens > self.max_tokens:
            # Dropping the oldest shifts every position, so the index is built anew: a quarter at a time.
            while len(self._outputs) > 3 * self.max_requests // 4 or self._num_tokens > 3 * self.max_tokens // 4:
                self._num_tokens -= len(self._outputs.popleft())
            self._tail = []
            self.corpus = self._order = self._sorted = np.empty(0, dtype=np.int64)

    def positions_of(self, token_id: int) -> np.ndarray:
        """Every position of `token_id` in `corpus`, ascending (after taking in what was added)."""
        self._take_in_added()
        lo, hi = np.searchsorted(self._sorted, [token_id, token_id + 1])
        indexed = self._order[lo:hi]
        tail = np.flatnonzero(self.corpus[len(self._order):] == token_id) + len(self._order)
        return np.concatenate([indexed, tail]) if len(tail) else indexed

    def _take_in_added(self) -> None:
        if not self._tail and len(self.corpus) == self._num_tokens:
            return
        if len(self.corpus) != self._num_tokens - sum(len(t) for t in self._tail):
            self.corpus = np.concatenate(list(self._outputs)) if self._outputs else np.empty(0, dtype=np.int64)
        else:
            self.corpus = np.concatenate([self.corpus, *self._tail])
        self._tail = []
        if len(self.corpus) - len(self._order) > len(self._order) // 4:
            self._order = np.argsort(self.corpus, kind="stable")
            self._sorted = self.corpus[self._order]


def longest_match(corpus: np.ndarray, candidates: np.ndarray, pattern: np.ndarray, max_depth: int
                  ) -> tuple[int, np.ndarray]:
    """(n, ends): the longest n <= max_depth such that the last n tokens of `pattern` occur in `corpus` ending at
    each of `ends`, given `candidates`, the positions of pattern's last token that may end a match."""
    ends, n = candidates, 1
    limit = min(max_depth, len(pattern))
    while n < limit:
        if len(ends) == 1:  # one occurrence left: extended a token at a time, without array operations
            return _extended_match(corpus, int(ends[0]), pattern, n, limit), ends
        longer = ends[ends >= n]
        longer = longer[corpus[longer - n] == pattern[-1 - n]]
        if not longer.size:
            break
        if len(longer) == len(ends) and len(longer) * (limit - n) <= _MAX_GATHERED:
            return _deepest(corpus, longer, pattern, n + 1, limit)  # none dropped out (a loop's): one gather
        ends, n = longer, n + 1
    return (n, ends) if ends.size else (0, ends)


def _deepest(corpus: np.ndarray, ends: np.ndarray, pattern: np.ndarray, n: int, limit: int) -> tuple[int, np.ndarray]:
    """(n, ends) of longest_match, given occurrences that all match n tokens."""
    if n >= limit:
        return n, ends
    depths = np.arange(n, limit)
    before = ends[:, None] - depths  # [occurrences, depths]: the tokens that would extend each match
    extends = (before >= 0) & (corpus[np.maximum(before, 0)] == pattern[-1 - depths])
    lengths = n + np.where(extends.all(axis=1), len(depths), np.argmin(extends, axis=1))
    longest = int(lengths.max())
    return longest, ends[lengths == longest]


def _extended_match(corpus: np.ndarray, end: int, pattern: np.ndarray, n: int, limit: int) -> int:
    """How far the match of length n ending at `end` extends backwards, up to `limit`."""
    while n < limit and end >= n and corpus[end - n] == pattern[-1 - n]:
        n += 1
    return n


def walk(corpus: np.ndarray, ends: np.ndarray, max_drafts: int, min_token_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation of the occurrences ending at `ends`, token by token while the path's
    probability stays at least `min_token_prob`: (its tokens, the sum of their probabilities)."""
    draft: list[int] = []
    probability = score = 1.0
    while len(draft) < max_drafts:
        if len(ends) == 1:  # one occurrence: its continuation, every token of which follows it alone (times 1)
            for token in _continuation(corpus, int(ends[0]), max_drafts - len(draft)):
                draft.append(token)
                score += probability
            break
        following = ends + 1
        following = following[following < len(corpus)]
        tokens = corpus[following]
        is_token = tokens != _SEPARATOR  # an output's end: counted among the occurrences, never drafted
        following, tokens = following[is_token], tokens[is_token]
        if not len(tokens):
            break
        token, count = _most_frequent(tokens)
        probability *= count / len(ends)
        if probability < min_token_prob:
            break
        draft.append(token)
        score += probability
        ends = following if count == len(tokens) else following[tokens == token]
        if count < len(tokens) or len(ends) * (max_drafts - len(draft)) > _MAX_GATHERED:
            continue
        # Every occurrence that went on went on alike (a loop's do): so may the next tokens, taken in one gather,
        # each at the probability that the occurrences still going on give it.
        run, counts, going_on = _agreed_run(corpus, ends, max_drafts - len(draft))
        num_going_on = len(ends)
        for token, count in zip(run, counts, strict=True):
            probability *= count / num_going_on
            if probability < min_token_prob:
                return draft, score - 1.0
            draft.append(token)
            score += probability
            num_going_on = count
        if run:
            ends = ends[going_on[:, len(run) - 1]] + len(run)
    return draft, score - 1.0


def _agreed_run(corpus: np.ndarray, ends: np.ndarray, max_tokens: int) -> tuple[list[int], list[int], np.ndarray]:
    """The tokens (up to `max_tokens`) that the occurrences ending at `ends` go on with alike, those that go on (not
    past the corpus or an output's end): (the tokens, how many occurrences go on to each, [occurrences, columns] whether
    each goes on through each column)."""
    width = min(max_tokens, len(corpus) - 1 - int(ends.min()))
    if width <= 0:
        return [], [], ends
    positions = ends[:, None] + np.arange(1, width + 1)  # [occurrences, width]
    following = corpus[np.minimum(positions, len(corpus) - 1)]
    going_on = np.logical_and.accumulate((positions < len(corpus)) & (following != _SEPARATOR), axis=1)
    tokens = following[np.argmax(going_on, axis=0), np.arange(width)]  # per column, an occurrence's still going on
    is_agreed = going_on.any(axis=0) & (~going_on | (following == tokens)).all(axis=0)
    num_agreed = width if is_agreed.all() else int(np.argmin(is_agreed))
    return tokens[:num_agreed].tolist(), going_on[:, :num_agreed].sum(axis=0).tolist(), going_on


def _continuation(corpus: np.ndarray, end: int, max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens after position `end`, up to the corpus's end or an output's."""
    following = corpus[end + 1 : end + 1 + max_tokens].tolist()
    return following[: following.index(_SEPARATOR)] if _SEPARATOR in following else following


def _most_frequent(tokens: np.ndarray) -> tuple[int, int]:
    """The most frequent of `tokens` (the least of equally frequent ones) and its count; counted in Python where
    they are few, which np.unique's sort costs more than."""
    if len(tokens) > _FEW_TOKENS:
        if (tokens == tokens[0]).all():  # a loop's occurrences, all followed alike: no sort
            return int(tokens[0]), len(tokens)
        values, counts = np.unique(tokens, return_counts=True)
        best = int(np.argmax(counts))
        return int(values[best]), int(counts[best])
    counts = Counter(tokens.tolist())
    token = min(counts, key=lambda t: (-counts[t], t))
    return token, counts[token]


class SuffixProposer:
    def __init__(self, max_depth: int, max_cached_requests: int, max_spec_factor: float, min_token_prob: float
                 ) -> None:
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.outputs = OutputCache(max_cached_requests)

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None:
        """Sets each sequence's draft_token_ids (at most its entry of `max_drafts`; maybe none)."""
        for seq, limit in zip(seqs, max_drafts, strict=True):
            if not isinstance(seq.draft_state, TokenBuffer):
                seq.draft_state = TokenBuffer()
            tokens = seq.draft_state.sync(seq.token_ids)
            own = self._draft(tokens, np.flatnonzero(tokens[:-1] == tokens[-1]), tokens, limit)
            candidates = self.outputs.positions_of(int(tokens[-1]))  # first: it takes in the outputs added
            cached = self._draft(self.outputs.corpus, candidates, tokens, limit)
            seq.draft_token_ids = max(own, cached, key=lambda drafted: drafted[1])[0]

    def on_finished(self, seq: Sequence) -> None:
        """A finished request's output joins the cache of earlier outputs."""
        if seq.num_output_tokens:
            self.outputs.add(seq.token_ids[seq.num_prompt_tokens :])

    def _draft(self, corpus: np.ndarray, candidates: np.ndarray, tokens: np.ndarray, limit: int
               ) -> tuple[list[int], float]:
        if not candidates.size:
            return [], 0.0
        n, ends = longest_match(corpus, candidates, tokens, self.max_depth)
        return walk(corpus, ends, min(limit, int(self.max_spec_factor * n)), self.min_token_prob)
