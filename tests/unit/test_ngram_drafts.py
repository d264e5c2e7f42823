"""gpu/kernels/ngram_drafts.py against core/ngram_proposer.py's lookup_draft under Triton's interpreter: the cases of
tests/unit/ngram_drafts_interpreted_cases.py, run by pytest in a process that has TRITON_INTERPRET=1 from its start;
and the wrapper's refusals, which come before any launch. tests/gpu/test_ngram_drafts_gpu.py runs the compiled
kernel, in a CUDA graph too."""

from pathlib import Path

import pytest
import torch

from tests.unit.interpreted import assert_cases_pass_under_the_interpreter

pytest.importorskip("triton")

from gpu.kernels import ngram_drafts as kernel  # noqa: E402
from gpu.kernels.ngram_drafts import ngram_drafts  # noqa: E402

CASES = Path(__file__).with_name("ngram_drafts_interpreted_cases.py")


def test_drafts_equal_lookup_drafts_under_the_interpreter() -> None:
    assert_cases_pass_under_the_interpreter(CASES)


@pytest.mark.parametrize(("history", "lengths", "settings"), [
    (torch.zeros(2, 5, dtype=torch.int64), torch.zeros(2, dtype=torch.int32), (4, 1, 3)),
    (torch.zeros(2, 5, dtype=torch.int32)[:, ::2], torch.zeros(2, dtype=torch.int32), (4, 1, 3)),
    (torch.zeros(2, 5, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), (4, 1, 3)),
    (torch.zeros(2, 0, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), (4, 1, 3)),
    (torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), (0, 1, 3)),
    (torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), (4, 0, 3)),
    (torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), (4, 3, 2)),
])
def test_wrapper_refuses_what_the_kernel_cannot_take(history: torch.Tensor, lengths: torch.Tensor,
                                                     settings: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        ngram_drafts(history, lengths, *settings)


def test_the_longest_lookup_keeps_a_key_in_int32() -> None:
    assert (kernel.MAX_LOOKUP << kernel.END_BITS | (1 << kernel.END_BITS) - 1) < 2**31
