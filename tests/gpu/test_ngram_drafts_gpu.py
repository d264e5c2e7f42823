"""gpu/kernels/ngram_drafts.py compiled on CUDA: each row's drafts are exactly core/ngram_proposer.py's lookup_draft's
(the cases of tests/unit/ngram_draft_cases.py, and rows at a model's context length), and a CUDA graph that captured
it gives the drafts of whatever history and lengths its static inputs hold at each replay."""

import random

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernel needs CUDA", allow_module_level=True)

from gpu.kernels.ngram_drafts import ngram_drafts  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402
from tests.unit.ngram_draft_cases import DraftCase, looping_case, random_case, spread_case  # noqa: E402

CUDA = torch.device("cuda")


def kept(drafts: torch.Tensor, num_drafts: torch.Tensor) -> list[list[int]]:
    return [row[:count] for row, count in zip(drafts.tolist(), num_drafts.tolist(), strict=True)]


def drafts_of(case: DraftCase, rng: random.Random) -> list[list[int]]:
    return case.drafts_by(ngram_drafts, rng, CUDA)


def test_random_rows_and_loops_get_lookup_drafts() -> None:
    rng = random.Random(0)
    for _ in range(300):
        case = random_case(rng, max_rows=16) if rng.random() < 0.8 else looping_case(rng)
        assert drafts_of(case, rng) == case.expected(), case


@pytest.mark.parametrize("length", [3000, 32000])
@pytest.mark.parametrize("max_n", [2, 4, 5])
def test_long_rows_get_lookup_drafts(length: int, max_n: int) -> None:
    rng = random.Random(length + max_n)
    assert drafts_of(spread := spread_case(rng, length, max_n), rng) == spread.expected()
    rows = [[rng.randrange(vocab) for _ in range(length)] for vocab in (50, 400, 5000)]
    case = DraftCase(rows, 4, 1, max_n, length)
    assert drafts_of(case, rng) == case.expected()


def test_a_captured_graph_drafts_from_what_its_inputs_hold_at_replay() -> None:
    rng = random.Random(2)
    num_rows, num_columns, max_drafts, min_n, max_n = 8, 4096, 4, 1, 4
    history = torch.zeros(num_rows, num_columns, dtype=torch.int32, device=CUDA)
    lengths = torch.ones(num_rows, dtype=torch.int32, device=CUDA)
    graph, (drafts, num_drafts) = captured(lambda: ngram_drafts(history, lengths, max_drafts, min_n, max_n))
    for _ in range(20):
        rows = [[rng.randrange(rng.randint(3, 60)) for _ in range(rng.randint(1, num_columns))]
                for _ in range(num_rows)]
        case = DraftCase(rows, max_drafts, min_n, max_n, num_columns)
        new_history, new_lengths = case.history(rng, CUDA)
        history.copy_(new_history)
        lengths.copy_(new_lengths)
        graph.replay()
        assert kept(drafts, num_drafts) == case.expected()
        lengths.copy_(new_lengths // 2)  # the same history, shorter rows
        graph.replay()
        shorter = DraftCase([row[:len(row) // 2] for row in rows], max_drafts, min_n, max_n, num_columns)
        assert kept(drafts, num_drafts) == shorter.expected()
