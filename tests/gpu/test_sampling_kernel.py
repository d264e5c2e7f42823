"""The sampling kernel (gpu/kernels/sampling.py) and the Sampler's CUDA path around it.

Skips cleanly without triton or CUDA. Draws are a pure function of the Philox keys, so the
statistical tests give the same counts every run at their fixed seeds and cannot flake; their
chi-square bounds sit at p = 1e-6 of the right distribution (another seed passes too), far below
what ignoring the temperature or drawing the wrong noise produces (checked by breaking the kernel:
see test_distribution_at_temperature).
"""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu.batch import RowSampling  # noqa: E402
from gpu.kernels.sampling import sample_tokens  # noqa: E402
from gpu.sampler import Sampler  # noqa: E402

DEVICE = torch.device("cuda")
VOCAB = 151936  # Qwen3's
SMALL_LOGITS = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]
CHI_SQUARE_Z = 4.753  # one-sided p = 1e-6
MIN_EXPECTED = 20  # draws per chi-square bin


def philox_keys(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 2**63 - 1, num_rows)).to(DEVICE)


def temperatures(num_rows: int, value: float) -> torch.Tensor:
    return torch.full((num_rows,), value, dtype=torch.float32, device=DEVICE)


def random_logits(num_rows: int, vocab: int, dtype: torch.dtype, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return (scale * torch.randn(num_rows, vocab, device=DEVICE, generator=generator)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, VOCAB), (5, 5000), (256, VOCAB), (3, 1), (2, 4097)])
def test_greedy_is_torch_argmax(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    logits = random_logits(*shape, dtype)
    token_ids = sample_tokens(logits, philox_keys(shape[0]), temperatures(shape[0], 0.0))
    # Ties included: both take the first index of the maximum (bf16 rows of 152k tokens do tie).
    assert torch.equal(token_ids, logits.argmax(dim=-1))


def test_greedy_ties_take_the_first_index_across_tiles_and_splits() -> None:
    logits = torch.zeros(4, VOCAB, dtype=torch.bfloat16, device=DEVICE)
    logits[1, [140000, 9000, 4097]] = 5.0
    logits[2, [1023, 1024, 2048]] = 5.0
    logits[3] = float("-inf")  # no candidate at all: token 0, as torch.argmax
    token_ids = sample_tokens(logits, philox_keys(4), temperatures(4, 0.0))
    assert token_ids.tolist() == [0, 4097, 1023, 0]


def chi_square_bound(degrees: int) -> float:
    """Wilson-Hilferty: the chi-square quantile at one-sided CHI_SQUARE_Z."""
    k = 2 / (9 * degrees)
    return degrees * (1 - k + CHI_SQUARE_Z * math.sqrt(k)) ** 3


def rank_bins(probs: np.ndarray, num_bins: int, num_draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens grouped by probability rank into bins of about equal mass, each expecting at least
    MIN_EXPECTED draws. Returns (bin of each token, expected draws of each bin)."""
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    rank_bin = np.minimum((before * num_bins).astype(np.int64), num_bins - 1)
    expected = np.bincount(rank_bin, weights=probs[order], minlength=num_bins) * num_draws
    merged, current, total = np.empty(num_bins, np.int64), 0, 0.0
    for b in range(num_bins):  # a bin starts once the one before expects enough draws
        if total >= MIN_EXPECTED:
            current, total = current + 1, 0.0
        merged[b], total = current, total + expected[b]
    if total < MIN_EXPECTED and current > 0:  # a short last bin joins the one before
        merged[merged == current] = current - 1
    bins = np.empty_like(rank_bin)
    bins[order] = merged[rank_bin]
    return bins, np.bincount(merged, weights=expected)


def chi_square(token_ids: torch.Tensor, logits: torch.Tensor, temperature: float) -> tuple[float, float]:
    probs = (logits.double().cpu() / temperature).softmax(-1).numpy()
    num_draws = token_ids.numel()
    bins, expected = rank_bins(probs, 64, num_draws)
    observed = np.bincount(bins[token_ids.cpu().numpy()], minlength=len(expected))
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return statistic, chi_square_bound(len(expected) - 1)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("vocab", [len(SMALL_LOGITS), VOCAB])
def test_distribution_at_temperature(temperature: float, vocab: int) -> None:
    """Many rows of one logits row, each with its own key: the draws follow softmax(logits / T).

    Verified to fail (statistic in the thousands or more) with the kernel broken two ways: the
    temperature ignored, and Exp(1) noise added as is instead of as -log(E)."""
    if vocab == VOCAB:
        row = random_logits(1, VOCAB, torch.bfloat16, scale=2.0, seed=1)[0]
        num_draws = 65536
    else:
        row = torch.tensor(SMALL_LOGITS, device=DEVICE)
        num_draws = 200_000
    logits = row.expand(num_draws, vocab)  # row stride 0: one row in memory
    token_ids = sample_tokens(logits, philox_keys(num_draws, seed=7), temperatures(num_draws, temperature))
    statistic, bound = chi_square(token_ids, row.float(), temperature)
    print(f"T={temperature} vocab={vocab}: chi-square {statistic:.1f} (bound {bound:.1f})")
    assert statistic < bound


def test_every_row_is_written_for_batch_sizes_1_to_256() -> None:
    logits = random_logits(256, VOCAB, torch.bfloat16)
    winners = torch.randint(0, VOCAB, (256,), device=DEVICE)
    logits[torch.arange(256, device=DEVICE), winners] = 100.0  # certain even at T = 2
    temps = torch.tensor([0.0, 0.6, 1.0, 2.0] * 64, device=DEVICE)
    keys = philox_keys(256)
    for num_rows in range(1, 257):
        torch.full((num_rows,), -1, dtype=torch.int64, device=DEVICE)  # the block the output will reuse
        token_ids = sample_tokens(logits[:num_rows], keys[:num_rows], temps[:num_rows])
        assert torch.equal(token_ids, winners[:num_rows]), f"{num_rows} rows"


def test_minus_infinity_is_never_drawn() -> None:
    logits = random_logits(2048, 4096, torch.float32, scale=1.0)
    logits[:, ::2] = float("-inf")
    token_ids = sample_tokens(logits, philox_keys(2048), temperatures(2048, 2.0))
    assert (token_ids % 2 == 1).all()


def test_seeded_row_draws_the_same_alone_and_in_any_batch() -> None:
    """The contract of test_seeded_sampling_alone_equals_in_a_batch (tests/unit/test_engine.py) on
    the CUDA path: batches of other sizes run the kernel with other split counts."""
    logits = random_logits(200, VOCAB, torch.bfloat16, scale=1.0)
    seeded = RowSampling(temperature=0.8, seed=1234, output_index=3)
    filtered = RowSampling(temperature=0.8, top_p=0.9, seed=99, output_index=1)
    alone = Sampler(DEVICE, 0)(logits[137:138], [seeded]).token_ids[0]
    filtered_alone = Sampler(DEVICE, 0)(logits[5:6], [filtered]).token_ids[0]
    rows = [RowSampling(temperature=0.7 + i % 3 * 0.4, seed=i if i % 2 else None) for i in range(200)]
    rows[1], rows[4] = RowSampling(temperature=0.0), RowSampling(top_k=20)
    rows[137], rows[5] = seeded, filtered
    for num_rows in (138, 200):
        batch = Sampler(DEVICE, 42)(logits[:num_rows], rows[:num_rows]).token_ids
        assert batch[137] == alone and batch[5] == filtered_alone
    draws = {Sampler(DEVICE, 0)(logits[:1], [RowSampling(seed=1234, output_index=i)]).token_ids[0] for i in range(20)}
    assert len(draws) > 1, "the output index moves the seeded stream on"


def test_unseeded_rows_follow_the_samplers_seed() -> None:
    logits = random_logits(64, VOCAB, torch.bfloat16, scale=1.0)
    rows = [RowSampling(temperature=1.0)] * 64
    first, second = Sampler(DEVICE, 5), Sampler(DEVICE, 5)
    steps = [first(logits, rows).token_ids for _ in range(3)]
    assert steps == [second(logits, rows).token_ids for _ in range(3)]
    assert steps[0] != steps[1], "every step draws fresh keys"


def test_sampler_follows_the_distribution_on_cuda() -> None:
    row = torch.tensor([0.6, 0.3, 0.1] + [1e-9] * 997).log().to(torch.bfloat16).to(DEVICE)
    tokens = Sampler(DEVICE, 0)(row.expand(20000, 1000), [RowSampling()] * 20000).token_ids
    share = [tokens.count(t) / 20000 for t in range(3)]
    assert share == pytest.approx([0.6, 0.3, 0.1], abs=0.02)


def test_banned_tokens_are_never_sampled() -> None:
    logits = random_logits(512, VOCAB, torch.bfloat16, scale=1.0)
    logits[:, 7] = 30.0
    logits[:, 8] = 29.0
    rows = [RowSampling(banned_token_ids=(7, 8))] * 510 + [RowSampling(temperature=0.0, banned_token_ids=(7,)),
                                                           RowSampling(top_k=3, banned_token_ids=(7,))]
    tokens = Sampler(DEVICE, 0)(logits, rows).token_ids
    assert not {7, 8} & set(tokens[:510])
    assert tokens[510] == 8 and tokens[511] != 7


def test_filtered_rows_keep_their_filters_beside_kernel_rows() -> None:
    row = torch.tensor([0.3, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.03]).log().to(DEVICE)
    rows = [RowSampling(top_k=2), RowSampling(), RowSampling(min_p=0.5), RowSampling(temperature=0.0)] * 500
    tokens = Sampler(DEVICE, 0)(row.expand(2000, 8), rows).token_ids
    assert set(tokens[0::4]) == {0, 1} and set(tokens[2::4]) == {0, 1, 2} and set(tokens[3::4]) == {0}
    assert len(set(tokens[1::4])) == 8


def test_logprobs_come_from_the_raw_float32_distribution() -> None:
    logits = random_logits(3, 1000, torch.bfloat16)
    rows = [RowSampling(temperature=0.7, num_top_logprobs=2), RowSampling(), RowSampling(temperature=0.0)]
    result = Sampler(DEVICE, 0)(logits, rows)
    expected = logits[0].float().log_softmax(-1)
    logprob = result.logprobs[0]
    assert logprob is not None and result.logprobs[1] is None
    assert logprob.logprob == pytest.approx(expected[result.token_ids[0]].item(), abs=1e-5)
    assert list(logprob.top_token_ids) == expected.topk(2).indices.tolist()
