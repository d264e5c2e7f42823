"""The penalty and token-mask kernels (gpu/kernels/penalties.py, token_mask.py) against the torch code they
replace on CUDA: the same floats bit for bit, so the sampler draws from the same logits with them or without."""

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu.batch import LogitBias, Penalties, RowSampling, TokenMask  # noqa: E402
from gpu.config import KernelConfig  # noqa: E402
from gpu.kernels.token_mask import apply_token_bitmask as kernel_mask  # noqa: E402
from gpu.penalties import PenaltyState  # noqa: E402
from gpu.sampler import Sampler  # noqa: E402
from gpu.token_mask import apply_token_bitmask as torch_mask  # noqa: E402
from tests.unit.penalty_cases import filled_state as shared_filled_state  # noqa: E402
from tests.unit.penalty_cases import penalty_cases  # noqa: E402

CUDA = torch.device("cuda")
VOCAB = 151936
NUM_SLOTS = 16


def filled_state(seed: int = 0) -> PenaltyState:
    return shared_filled_state(NUM_SLOTS, VOCAB, CUDA, 100, 3000, 40, seed)


PENALTY_CASES = penalty_cases(NUM_SLOTS)


@pytest.mark.parametrize("case", PENALTY_CASES)
@pytest.mark.parametrize("every_row", [True, False])
def test_penalty_kernel_gives_the_torch_floats(case: str, every_row: bool) -> None:
    state = filled_state()
    penalties = [PENALTY_CASES[case](i) for i in range(10)]
    num_rows = 10 if every_row else 13
    where = None if every_row else torch.tensor([0, 1, 2, 4, 5, 7, 8, 9, 11, 12], device=CUDA)
    logits = torch.randn(num_rows, VOCAB, device=CUDA) * 5
    by_torch, by_kernel = logits.clone(), logits.clone()
    state.apply(by_torch, where, penalties, use_kernel=False)
    state.apply(by_kernel, where, penalties, use_kernel=True)
    assert torch.equal(by_kernel, by_torch)
    assert not torch.equal(by_kernel, logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_words", [(VOCAB + 31) // 32, 1536, 1])  # the model's vocabulary, a tokenizer's, one word
def test_token_mask_kernel_gives_the_torch_floats(dtype: torch.dtype, num_words: int) -> None:
    generator = torch.Generator(device=CUDA).manual_seed(num_words)
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, num_words), dtype=torch.int32, device=CUDA, generator=generator)
    bitmask[1] = -1  # every token of the mask allowed
    bitmask[2] = 0  # none
    logits = (torch.randn(8, VOCAB, device=CUDA, generator=generator) * 3).to(dtype)
    where = torch.tensor([6, 0, 3, 2, 7], device=CUDA)
    by_torch, by_kernel = logits.clone(), logits.clone()
    torch_mask(by_torch, where, bitmask)
    kernel_mask(by_kernel, where, bitmask)
    assert torch.equal(by_kernel, by_torch)
    assert torch.equal(by_kernel[[1, 4, 5]], logits[[1, 4, 5]])  # rows without a mask
    assert torch.isinf(by_kernel[3]).all()  # mask row 2 allows nothing
    assert not torch.isinf(by_kernel[0, : 32 * num_words]).any()  # mask row 1 allows every token of its words
    assert torch.isinf(by_kernel[0, 32 * num_words :]).all()  # and none past them


def test_sampler_adjusts_to_the_same_floats_with_the_kernels_or_the_torch_code() -> None:
    """Every adjustment at once, 64 rows of which some are seeded, greedy, filtered or masked: the same adjusted
    logits bit for bit (so the same draw from them), and the drawn tokens inside their masks."""
    num_rows = 64
    logits = (torch.randn(num_rows, VOCAB, device=CUDA) * 3).to(torch.bfloat16)
    rows = []
    for i in range(num_rows):
        penalties = Penalties(i % NUM_SLOTS, presence=0.5, frequency=0.5, repetition=1.2) if i % 3 else None
        bias = LogitBias(np.arange(100, 116), np.full(16, -1.0, np.float32)) if i % 4 == 0 else None
        rows.append(RowSampling(temperature=0.0 if i % 5 == 0 else 0.8, seed=i if i % 2 else None, output_index=3,
                                top_p=0.9 if i % 7 == 0 else 1.0, penalties=penalties, logit_bias=bias,
                                banned_token_ids=(2, 3) if i % 6 == 0 else (), has_token_mask=i % 2 == 0))
    masked = [i for i in range(num_rows) if i % 2 == 0]
    bitmask = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (len(masked), 1536), dtype=np.int64)
    mask = TokenMask(masked, bitmask.astype(np.int32))

    def adjusted(kernels: KernelConfig) -> torch.Tensor:
        sampler = Sampler(CUDA, seed=7, kernels=kernels, penalty_state=filled_state())
        return sampler._adjusted_logits(logits, rows, [i for i, r in enumerate(rows) if r.adjusts_logits], None, mask)

    by_kernels = adjusted(KernelConfig())
    assert torch.equal(by_kernels, adjusted(KernelConfig(fused_kernels=False)))
    assert not torch.equal(by_kernels, logits.float())
    tokens = Sampler(CUDA, seed=7, penalty_state=filled_state())(logits, rows, token_mask=mask).token_ids
    words = mask.bitmask.view(np.uint32)
    assert all(t < 32 * 1536 and (int(words[j, t // 32]) >> (t % 32)) & 1
               for j, t in enumerate(tokens[i] for i in masked))
