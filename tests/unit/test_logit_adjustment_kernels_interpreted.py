"""The penalty and token-mask kernels (gpu/kernels/penalties.py, token_mask.py) run by Triton's interpreter on
the CPU against the torch code they replace on CUDA (its reference): their indexing, masks and flags, on a small
vocabulary. tests/gpu/test_logit_adjustment_kernels.py checks the compiled kernels' floats on CUDA."""

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from gpu.batch import LogitBias, Penalties, RowSampling, TokenMask
from gpu.config import KernelConfig
from gpu.penalties import PenaltyState
from gpu.sampler import Sampler
from gpu.token_mask import apply_token_bitmask as torch_mask
from tests.unit.penalty_cases import filled_state as shared_filled_state
from tests.unit.penalty_cases import penalty_cases

pytest.importorskip("triton")

CPU = torch.device("cpu")
VOCAB = 5003  # no multiple of 32 nor of the kernels' blocks
NUM_SLOTS = 8
KERNELS_DIR = Path(__file__).resolve().parents[2] / "gpu" / "kernels"


def interpreted(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """gpu/kernels/<name>.py loaded afresh with TRITON_INTERPRET=1 (its kernels decorated as interpreted ones), and
    put where the lazy imports of gpu/penalties.py and gpu/sampler.py find it, for this test only."""
    with monkeypatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        spec = importlib.util.spec_from_file_location(f"gpu.kernels.{name}", KERNELS_DIR / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, f"gpu.kernels.{name}", module)
    return module


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    yield interpreted("penalties", monkeypatch), interpreted("token_mask", monkeypatch)


def filled_state(seed: int = 0) -> PenaltyState:
    return shared_filled_state(NUM_SLOTS, VOCAB, CPU, 30, 300, 20, seed)


PENALTY_CASES = penalty_cases(NUM_SLOTS)


@pytest.mark.parametrize("case", PENALTY_CASES)
@pytest.mark.parametrize("every_row", [True, False])
def test_penalty_kernel_gives_the_torch_floats(kernels: tuple[ModuleType, ModuleType], case: str,
                                               every_row: bool) -> None:
    state = filled_state()
    penalties = [PENALTY_CASES[case](i) for i in range(6)]
    num_rows = 6 if every_row else 9
    where = None if every_row else torch.tensor([0, 2, 3, 5, 7, 8])
    logits = torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(1)) * 5
    by_torch, by_kernel = logits.clone(), logits.clone()
    state.apply(by_torch, where, penalties, use_kernel=False)
    state.apply(by_kernel, where, penalties, use_kernel=True)
    assert torch.equal(by_kernel, by_torch)
    assert not torch.equal(by_kernel, logits)
    if where is not None:
        untouched = [1, 4, 6]
        assert torch.equal(by_kernel[untouched], logits[untouched])


@pytest.mark.parametrize("num_words", [(VOCAB + 31) // 32, 100, 1])  # the whole vocabulary, part of it, one word
def test_token_mask_kernel_gives_the_torch_floats(kernels: tuple[ModuleType, ModuleType], num_words: int) -> None:
    _, token_mask = kernels
    generator = torch.Generator().manual_seed(num_words)
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, num_words), dtype=torch.int32, generator=generator)
    bitmask[1] = -1  # every token of the mask allowed
    bitmask[2] = 0  # none
    logits = torch.randn(6, VOCAB, generator=generator) * 3
    where = torch.tensor([5, 0, 3, 2])
    by_torch, by_kernel = logits.clone(), logits.clone()
    torch_mask(by_torch, where, bitmask)
    token_mask.apply_token_bitmask(by_kernel, where, bitmask)
    assert torch.equal(by_kernel, by_torch)
    assert torch.equal(by_kernel[[1, 4]], logits[[1, 4]])  # rows without a mask
    assert torch.isinf(by_kernel[3]).all()  # mask row 2 allows nothing
    allowed = min(32 * num_words, VOCAB)
    assert not torch.isinf(by_kernel[0, :allowed]).any()  # mask row 1 allows every token of its words
    assert torch.isinf(by_kernel[0, allowed:]).all()  # and none past them


def test_sampler_draws_the_same_tokens_with_the_kernels_on_or_off(kernels: tuple[ModuleType, ModuleType],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every adjustment at once through the sampler, the kernels taken as on CUDA."""
    monkeypatch.setattr(Sampler, "_uses_adjustment_kernels",
                        lambda self, logits: self.kernels.fused_kernels)
    num_rows = 24
    logits = torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    rows = []
    for i in range(num_rows):
        penalties = Penalties(i % NUM_SLOTS, presence=0.5, frequency=0.5, repetition=1.2) if i % 3 else None
        bias = LogitBias(np.arange(100, 116), np.full(16, -1.0, np.float32)) if i % 4 == 0 else None
        rows.append(RowSampling(temperature=0.0 if i % 5 == 0 else 0.8, seed=i if i % 2 else None, output_index=3,
                                top_p=0.9 if i % 7 == 0 else 1.0, penalties=penalties, logit_bias=bias,
                                banned_token_ids=(2, 3) if i % 6 == 0 else (), has_token_mask=i % 2 == 0))
    masked = [i for i in range(num_rows) if i % 2 == 0]
    bitmask = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (len(masked), 40), dtype=np.int64)
    mask = TokenMask(masked, bitmask.astype(np.int32))

    def adjusted_and_tokens(kernels: KernelConfig) -> tuple[torch.Tensor, list[int]]:
        sampler = Sampler(CPU, seed=7, kernels=kernels, penalty_state=filled_state())
        adjusted = sampler._adjusted_logits(logits, rows, [i for i, r in enumerate(rows) if r.adjusts_logits],
                                            None, mask)
        sampler = Sampler(CPU, seed=7, kernels=kernels, penalty_state=filled_state())
        return adjusted, sampler(logits, rows, token_mask=mask).token_ids

    (on_logits, on), (off_logits, off) = (adjusted_and_tokens(KernelConfig()),
                                          adjusted_and_tokens(KernelConfig(fused_kernels=False)))
    assert torch.equal(on_logits, off_logits)
    assert on == off
    words = mask.bitmask.view(np.uint32)
    assert all(t < 32 * 40 and (int(words[j, t // 32]) >> (t % 32)) & 1 for j, t in enumerate(on[i] for i in masked))
