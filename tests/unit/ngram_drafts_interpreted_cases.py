"""gpu/kernels/ngram_drafts.py under Triton's interpreter on the CPU: each row's drafts are exactly
core/ngram_proposer.py's lookup_draft's, on random rows in small vocabularies, loops, rows whose matches lie many tiles
back, rows with no match and rows of one token, rows of different lengths in one batch. Run by
tests/unit/test_ngram_drafts.py in a process that has TRITON_INTERPRET=1 from its start."""

import os
import random

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.ngram_drafts import ngram_drafts  # noqa: E402
from tests.unit.ngram_draft_cases import DraftCase, check_random_rows, looping_case, spread_case  # noqa: E402

CPU = torch.device("cpu")


def drafts_of(case: DraftCase, rng: random.Random) -> list[list[int]]:
    return case.drafts_by(ngram_drafts, rng, CPU)


def test_random_rows_get_lookup_drafts() -> None:
    check_random_rows(ngram_drafts, CPU)


def test_loops_continue_past_the_end() -> None:
    rng = random.Random(1)
    for _ in range(30):
        case = looping_case(rng)
        assert drafts_of(case, rng) == case.expected(), case


@pytest.mark.parametrize("length", [1500, 2600])
@pytest.mark.parametrize("max_n", [3, 4, 5])
def test_matches_many_tiles_back(length: int, max_n: int) -> None:
    rng = random.Random(length + max_n)
    case = spread_case(rng, length, max_n)
    expected = case.expected()
    assert [bool(drafts) for drafts in expected] == [True, True, False, False]
    assert drafts_of(case, rng) == expected


def test_rows_of_one_token_or_none_get_no_drafts() -> None:
    history = torch.tensor([[3, 3, 3], [3, 3, 3], [1, 2, 1]], dtype=torch.int32)
    drafts, num_drafts = ngram_drafts(history, torch.tensor([1, 0, 3], dtype=torch.int32), 2, 1, 3)
    assert num_drafts.tolist() == [0, 0, 2] and drafts.tolist() == [[0, 0], [0, 0], [2, 1]]


def test_lengths_past_the_history_count_as_its_width() -> None:
    history = torch.tensor([[4, 5, 4]], dtype=torch.int32)
    drafts, num_drafts = ngram_drafts(history, torch.tensor([9], dtype=torch.int32), 3, 1, 2)
    assert num_drafts.tolist() == [3] and drafts.tolist() == [[5, 4, 5]]
