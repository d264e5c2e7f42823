"""gpu/token_history.py: the torch n-gram drafts equal core/ngram_proposer.py's lookup_draft (the cases the Triton
kernel's tests use), and a slot's tokens are what the host filled plus what steps appended, nothing past them."""

import random

import torch

from gpu.token_history import HistoryFill, TokenHistory, torch_ngram_drafts
from tests.unit.ngram_draft_cases import DraftCase, check_random_rows, looping_case, spread_case

CPU = torch.device("cpu")


def drafts_of(case: DraftCase, rng: random.Random) -> list[list[int]]:
    return case.drafts_by(torch_ngram_drafts, rng, CPU)


def test_torch_drafts_equal_lookup_drafts() -> None:
    check_random_rows(torch_ngram_drafts, CPU)
    rng = random.Random(1)
    for _ in range(30):
        case = looping_case(rng)
        assert drafts_of(case, rng) == case.expected(), case
    for max_n in (3, 5):
        case = spread_case(rng, 1500, max_n)
        expected = case.expected()
        assert [bool(d) for d in expected] == [True, True, False, False]
        assert drafts_of(case, rng) == expected


def test_fill_then_append_keeps_accepted_tokens_only() -> None:
    history = TokenHistory(num_slots=3, max_model_len=10, device=CPU)
    history.fill([HistoryFill(2, 0, [5, 6, 7]), HistoryFill(0, 0, [1])])
    history.fill([HistoryFill(2, 3, [8])])  # tokens a step without history gave it
    slots = torch.tensor([2, 0])
    history.append(slots, torch.tensor([[9, 10, 11], [2, 3, 4]]), torch.tensor([2, 3]))
    assert history.lengths.tolist() == [4, 0, 6, 1]  # the padding slot holds one token
    assert history.tokens[2, :6].tolist() == [5, 6, 7, 8, 9, 10]
    assert history.tokens[0, :4].tolist() == [1, 2, 3, 4]
    assert history.tokens[2, 6:10].tolist() == [0] * 4  # the rejected token went to the spare column
    history.append(slots[:1], torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.tensor([6]))
    assert history.lengths[2] == 10  # never past max_model_len
    assert history.tokens[2, :10].tolist() == [5, 6, 7, 8, 9, 10, 1, 2, 3, 4]
    padding = torch.tensor([history.padding_slot] * 2)  # padding rows (repeated) append nothing
    history.append(padding, torch.tensor([[7, 7], [8, 8]]), torch.tensor([0, 0]))
    assert history.lengths[history.padding_slot] == 1 and history.tokens[history.padding_slot, :10].tolist() == [0] * 10
