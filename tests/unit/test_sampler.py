"""Sampler: each filter keeps exactly the tokens it should; seeded rows are independent of the batch."""

import pytest
import torch

from gpu.batch import RowSampling
from gpu.sampler import Sampler

VOCAB = 8


def sample_many(rows: list[RowSampling], logits: torch.Tensor, times: int = 400) -> list[set[int]]:
    sampler = Sampler(torch.device("cpu"), seed=0)
    seen: list[set[int]] = [set() for _ in rows]
    for _ in range(times):
        for i, token in enumerate(sampler(logits, rows).token_ids):
            seen[i].add(token)
    return seen


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()


def test_greedy_takes_argmax() -> None:
    logits = torch.randn(5, VOCAB)
    result = Sampler(torch.device("cpu"), 0)(logits, [RowSampling(temperature=0.0)] * 5)
    assert result.token_ids == logits.argmax(-1).tolist()


def test_greedy_on_bf16_logits_matches_float32_and_honours_bans() -> None:
    """The greedy-only path takes the model-dtype logits as they are (no float32 copy)."""
    logits = torch.randn(6, 300).to(torch.bfloat16)
    rows = [RowSampling(temperature=0.0)] * 5 + [RowSampling(temperature=0.0, banned_token_ids=(7,))]
    logits[5, 7] = 100.0
    result = Sampler(torch.device("cpu"), 0)(logits, rows)
    expected = logits.float().argmax(-1)
    expected[5] = logits[5].float().scatter(0, torch.tensor([7]), float("-inf")).argmax()
    assert result.token_ids == expected.tolist() and result.token_ids[5] != 7


def test_top_k_keeps_the_k_most_likely() -> None:
    logits = logits_of([0.3, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.03])
    assert sample_many([RowSampling(top_k=3)], logits) == [{0, 1, 2}]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = logits_of([0.5, 0.3, 0.1, 0.05, 0.02, 0.01, 0.01, 0.01])
    assert sample_many([RowSampling(top_p=0.75)], logits) == [{0, 1}]
    assert sample_many([RowSampling(top_p=0.1)], logits) == [{0}]


def test_min_p_drops_tokens_below_a_share_of_the_top() -> None:
    logits = logits_of([0.4, 0.3, 0.15, 0.05, 0.04, 0.03, 0.02, 0.01])
    assert sample_many([RowSampling(min_p=0.3)], logits) == [{0, 1, 2}]


def test_rows_with_different_filters_in_one_batch() -> None:
    logits = logits_of([0.3, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.03]).repeat(3, 1)
    rows = [RowSampling(top_k=1), RowSampling(top_k=2), RowSampling(temperature=0.0)]
    assert sample_many(rows, logits) == [{0}, {0, 1}, {0}]


def test_banned_tokens_are_never_sampled() -> None:
    logits = logits_of([0.9, 0.05, 0.01, 0.01, 0.01, 0.01, 0.005, 0.005])
    seen = sample_many([RowSampling(banned_token_ids=(0, 1)), RowSampling(temperature=0.0, banned_token_ids=(0,))],
                       logits.repeat(2, 1))
    assert 0 not in seen[0] and 1 not in seen[0]
    assert seen[1] == {1}


def test_sampling_follows_the_distribution() -> None:
    logits = logits_of([0.6, 0.3, 0.1, 1e-9, 1e-9, 1e-9, 1e-9, 1e-9]).repeat(4000, 1)
    tokens = Sampler(torch.device("cpu"), 0)(logits, [RowSampling()] * 4000).token_ids
    share = [tokens.count(t) / 4000 for t in range(3)]
    assert share == pytest.approx([0.6, 0.3, 0.1], abs=0.03)


def test_seeded_row_draws_the_same_whatever_the_batch() -> None:
    logits = torch.randn(6, VOCAB * 10)
    seeded = RowSampling(seed=1234, output_index=3)
    alone = Sampler(torch.device("cpu"), 0)(logits[2:3], [seeded]).token_ids[0]
    others = [RowSampling(seed=i) for i in range(5)]
    in_batch = Sampler(torch.device("cpu"), 99)(logits[[0, 1, 2, 3]], [others[0], others[1], seeded, others[2]])
    assert in_batch.token_ids[2] == alone
    draws = {Sampler(torch.device("cpu"), 0)(logits[2:3], [RowSampling(seed=1234, output_index=i)]).token_ids[0]
             for i in range(20)}
    assert len(draws) > 1, "the output index moves the seeded stream on"


def test_logprobs_are_from_the_raw_distribution() -> None:
    logits = torch.randn(2, VOCAB)
    rows = [RowSampling(temperature=0.0, num_top_logprobs=3), RowSampling(temperature=0.5, num_top_logprobs=None)]
    result = Sampler(torch.device("cpu"), 0)(logits, rows)
    expected = logits[0].log_softmax(-1)
    lp = result.logprobs[0]
    assert lp is not None and result.logprobs[1] is None
    assert lp.logprob == pytest.approx(expected.max().item(), abs=1e-6) and lp.rank == 1
    assert list(lp.top_token_ids) == expected.topk(3).indices.tolist()
    assert lp.top_logprobs == pytest.approx(expected.topk(3).values.tolist(), abs=1e-6)


def test_logprob_rank_of_a_sampled_token() -> None:
    logits = logits_of([0.5, 0.3, 0.2, 1e-9, 1e-9, 1e-9, 1e-9, 1e-9])
    rows = [RowSampling(banned_token_ids=(0,), num_top_logprobs=0)]
    result = Sampler(torch.device("cpu"), 0)(logits, rows)
    assert result.token_ids[0] in (1, 2)
    assert result.logprobs[0].rank == result.token_ids[0] + 1
    assert result.logprobs[0].top_token_ids == ()


def test_philox_keys_of_seeded_rows_depend_on_the_row_alone() -> None:
    """The keys the CUDA kernel gets (built on the host, so this runs on CPU too)."""
    seeded = RowSampling(temperature=0.7, seed=1234, output_index=3)
    alone_keys, alone_temperatures = Sampler(torch.device("cpu"), 0)._philox_keys([seeded])
    rows = [RowSampling(), seeded, RowSampling(temperature=0.0), RowSampling(seed=1234, output_index=4)]
    keys, temperatures = Sampler(torch.device("cpu"), 99)._philox_keys(rows)
    assert keys[1] == alone_keys[0] and keys[3] != keys[1]
    assert temperatures.tolist() == pytest.approx([1.0, 0.7, 0.0, 1.0]) and alone_temperatures.tolist() == [
        pytest.approx(0.7)]


def test_philox_keys_of_unseeded_rows_follow_the_samplers_seed() -> None:
    rows = [RowSampling()] * 4
    first, second, other = (Sampler(torch.device("cpu"), seed) for seed in (5, 5, 6))
    steps = [first._philox_keys(rows)[0].tolist() for _ in range(2)]
    assert steps == [second._philox_keys(rows)[0].tolist() for _ in range(2)]
    assert steps[0] != steps[1] and len(set(steps[0])) == 4
    assert other._philox_keys(rows)[0].tolist() != steps[0]
