"""Batches of token histories for gpu/kernels/ngram_drafts.py's tests (tests/unit under Triton's interpreter,
tests/gpu on CUDA), and the drafts core/ngram_proposer.py's lookup_draft gives each row: its definition."""

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.ngram_proposer import lookup_draft


@dataclass(frozen=True)
class DraftCase:
    rows: list[list[int]]  # each row's tokens
    max_drafts: int
    min_n: int
    max_n: int
    num_columns: int  # the history's width, at least the longest row

    def history(self, rng: random.Random, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(history [R, num_columns] int32, lengths [R] int32); past each row's length, tokens of its vocabulary
        at random, so a kernel that reads past a row's length finds matches there."""
        vocab = max((max(row) for row in self.rows if row), default=0) + 1
        padded = [row + [rng.randrange(vocab) for _ in range(self.num_columns - len(row))] for row in self.rows]
        history = torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(self.rows), self.num_columns)
        lengths = torch.tensor([len(row) for row in self.rows], dtype=torch.int32, device=device)
        return history, lengths

    def expected(self) -> list[list[int]]:
        return [lookup_draft(row, self.max_drafts, self.min_n, self.max_n) for row in self.rows]

    def drafts_by(self, propose: "DraftFn", rng: random.Random, device: torch.device) -> list[list[int]]:
        """The drafts `propose` gives this case's rows, each row's first num_drafts, after checking the tensors'
        shapes and dtypes and that a row gets all its drafts or none, zeros past them."""
        history, lengths = self.history(rng, device)
        drafts, num_drafts = propose(history, lengths, self.max_drafts, self.min_n, self.max_n)
        assert drafts.shape == (len(self.rows), self.max_drafts) and num_drafts.shape == (len(self.rows),)
        assert drafts.dtype == num_drafts.dtype == torch.int32
        for row, count in zip(drafts.tolist(), num_drafts.tolist(), strict=True):
            assert count in (0, self.max_drafts) and row[count:] == [0] * (self.max_drafts - count)
        return [row[:count] for row, count in zip(drafts.tolist(), num_drafts.tolist(), strict=True)]


# (history [R, C] int32, lengths [R] int32, most drafts, min n, max n) -> (drafts [R, most], num_drafts [R])
DraftFn = Callable[[torch.Tensor, torch.Tensor, int, int, int], tuple[torch.Tensor, torch.Tensor]]


def check_random_rows(propose: DraftFn, device: torch.device) -> None:
    """150 batches of random rows: `propose` gives each row lookup_draft's drafts; rows with drafts and rows without
    both occur."""
    rng = random.Random(0)
    num_with_drafts = num_rows = 0
    for _ in range(150):
        case = random_case(rng)
        expected = case.expected()
        assert case.drafts_by(propose, rng, device) == expected, case
        num_with_drafts += sum(map(bool, expected))
        num_rows += len(expected)
    assert num_rows > 400 and 0 < num_with_drafts < num_rows


def random_case(rng: random.Random, max_length: int = 300, max_rows: int = 6) -> DraftCase:
    """Rows of different lengths (1 to `max_length`) in a small vocabulary (3 to 8 tokens), so matches happen."""
    vocab = rng.randint(3, 8)
    rows = [[rng.randrange(vocab) for _ in range(rng.randint(1, max_length))] for _ in range(rng.randint(1, max_rows))]
    min_n = rng.randint(1, 2)
    return DraftCase(rows, rng.randint(1, 6), min_n, rng.randint(min_n, 5),
                     max(map(len, rows)) + rng.randint(0, 7))


def looping_case(rng: random.Random) -> DraftCase:
    """Rows that repeat a loop of 1 to 7 tokens (after a short random lead-in), cut at any point of the loop: their
    drafts continue the loop past the row's end."""
    rows = []
    for _ in range(rng.randint(1, 6)):
        loop = [rng.randrange(100, 200) for _ in range(rng.randint(1, 7))]
        lead_in = [rng.randrange(100) for _ in range(rng.randint(0, 5))]
        rows.append(lead_in + (loop * 60)[:rng.randint(1, 50)])
    return DraftCase(rows, rng.randint(1, 6), 1, rng.randint(1, 5), max(map(len, rows)))


def spread_case(rng: random.Random, length: int, max_n: int = 4) -> DraftCase:
    """Rows of `length` distinct tokens but for suffixes planted earlier, far from the end (many tiles of the
    kernel's scan back): one row where a shorter match is later than the longest, one with a match only at the
    start, one with none, one of one token."""
    def distinct(count: int, first: int) -> list[int]:
        return list(range(first, first + count))

    suffix = [7, 8, 9, 10]
    longest_far = [*suffix, 50] + distinct(length // 2, 1000) + [*suffix[1:], 60] + distinct(length // 2, 90000)
    only_at_start = [*suffix, 70] + distinct(length, 1000)
    rows = [longest_far + suffix, only_at_start + suffix, distinct(length, 1000), [5]]
    return DraftCase(rows, rng.randint(1, 6), 1, max_n, max(map(len, rows)) + 3)
