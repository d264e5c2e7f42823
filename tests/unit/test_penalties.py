"""Penalties and logit bias on the device (gpu/penalties.py, gpu/sampler.py), against transformers'
logits processors on the same logits, and the device-side counts they read."""

import numpy as np
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

from gpu.batch import LogitBias, Penalties, PenaltySlotInit, RowSampling
from gpu.penalties import PenaltyState
from gpu.sampler import Sampler

VOCAB = 64
CPU = torch.device("cpu")


def openai_penalties(logits: torch.Tensor, output_ids: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's documented formula: mu[j] - c[j] * frequency - float(c[j] > 0) * presence."""
    counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=logits.shape[-1]).float()
    return logits - counts * frequency - (counts > 0).float() * presence


def filled_state(histories: list[tuple[list[int], list[int]]]) -> PenaltyState:
    state = PenaltyState(num_slots=8, vocab_size=VOCAB, device=CPU)
    state.fill([PenaltySlotInit(slot, prompt, output) for slot, (prompt, output) in enumerate(histories)])
    return state


def histories(num_rows: int) -> list[tuple[list[int], list[int]]]:
    generator = torch.Generator().manual_seed(num_rows)
    return [(torch.randint(0, VOCAB, (5 + 3 * i,), generator=generator).tolist(),
             torch.randint(0, VOCAB, (2 + 4 * i,), generator=generator).tolist()) for i in range(num_rows)]


@pytest.mark.parametrize("repetition", [1.3, 0.7])
def test_repetition_penalty_matches_transformers_processor(repetition: float) -> None:
    rows = histories(4)
    logits = torch.randn(4, VOCAB) * 3
    ours = logits.clone()
    filled_state(rows).apply(ours, None, [Penalties(slot=i, repetition=repetition) for i in range(4)])
    processor = RepetitionPenaltyLogitsProcessor(penalty=repetition)
    for i, (prompt, output) in enumerate(rows):
        expected = processor(torch.tensor([prompt + output]), logits[i : i + 1].clone())
        torch.testing.assert_close(ours[i : i + 1], expected, rtol=0, atol=0)
    assert not torch.equal(ours, logits)


def test_presence_and_frequency_follow_openais_formula_over_generated_tokens_only() -> None:
    rows = histories(3)
    logits = torch.randn(3, VOCAB)
    penalties = [Penalties(slot=0, presence=0.5), Penalties(slot=1, frequency=0.7),
                 Penalties(slot=2, presence=-1.0, frequency=1.5)]
    ours = logits.clone()
    filled_state(rows).apply(ours, None, penalties)
    for i, ((_, output), p) in enumerate(zip(rows, penalties, strict=True)):
        torch.testing.assert_close(ours[i], openai_penalties(logits[i], output, p.presence, p.frequency))


def test_penalties_of_some_rows_leave_the_others_alone() -> None:
    rows = histories(3)
    logits = torch.randn(3, VOCAB)
    ours = logits.clone()
    filled_state(rows).apply(ours, torch.tensor([2]), [Penalties(slot=2, repetition=2.0, frequency=0.3)])
    assert torch.equal(ours[:2], logits[:2])
    prompt, output = rows[2]
    expected = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([prompt + output]), logits[2:3].clone())[0]
    torch.testing.assert_close(ours[2], openai_penalties(expected, output, 0.0, 0.3))


def test_logit_bias_matches_transformers_sequence_bias() -> None:
    logits = torch.randn(2, VOCAB)
    bias = {3: 5.0, 10: -100.0, 63: 0.25}
    row = RowSampling(temperature=0.0, logit_bias=LogitBias(np.array(list(bias), dtype=np.int64),
                                                            np.array(list(bias.values()), dtype=np.float32)))
    sampler = Sampler(CPU, 0)
    adjusted = sampler._adjusted_logits(logits, [RowSampling(temperature=0.0), row], [1], None, None)
    processor = SequenceBiasLogitsProcessor(sequence_bias=[[[t], v] for t, v in bias.items()])
    torch.testing.assert_close(adjusted[1:], processor(torch.tensor([[0]]), logits[1:].clone()))
    assert torch.equal(adjusted[0], logits[0])


def test_bias_of_plus_100_forces_and_minus_100_bans() -> None:
    logits = torch.randn(4, VOCAB) * 5
    top = logits.argmax(-1)

    def biased(token_ids: list[int], value: float, **kw: object) -> RowSampling:
        return RowSampling(logit_bias=LogitBias(np.array(token_ids), np.full(len(token_ids), value, np.float32)), **kw)

    sampler = Sampler(CPU, 0)
    for _ in range(50):
        rows = [biased([7], 100.0), biased([7], 100.0, temperature=0.0),
                biased([int(top[2])], -100.0, temperature=0.0), biased(list(range(VOCAB - 1)), -100.0)]
        tokens = sampler(logits, rows).token_ids
        assert tokens[:2] == [7, 7] and tokens[2] != top[2] and tokens[3] == VOCAB - 1


def test_counts_follow_the_sampled_tokens_on_the_device() -> None:
    """Each step's tokens are added to their row's slot by the sampler itself: no host round trip."""
    state = PenaltyState(num_slots=4, vocab_size=VOCAB, device=CPU)
    sampler = Sampler(CPU, 0, penalty_state=state)
    prompts = {1: [5, 6], 3: [7]}
    rows = [RowSampling(penalties=Penalties(slot=3, frequency=0.1)), RowSampling(),
            RowSampling(penalties=Penalties(slot=1, presence=0.1, repetition=1.1))]
    inits = [PenaltySlotInit(3, prompts[3], [9, 9]), PenaltySlotInit(1, prompts[1], [])]
    drawn: dict[int, list[int]] = {3: [9, 9], 1: []}
    for step in range(6):
        tokens = sampler(torch.randn(3, VOCAB), rows, inits if step == 0 else None).token_ids
        drawn[3].append(tokens[0])
        drawn[1].append(tokens[2])
    for slot, tokens in drawn.items():
        assert state.output_counts[slot].tolist() == np.bincount(tokens, minlength=VOCAB).tolist()
        assert state.prompt_seen[slot].nonzero().flatten().tolist() == sorted(prompts[slot])
    assert state.output_counts[[0, 2]].sum() == 0


def test_a_slot_filled_anew_forgets_its_previous_sequence() -> None:
    state = filled_state([([1, 2, 3], [4, 4, 5])])
    state.fill([PenaltySlotInit(0, [6], [7])])
    assert state.output_counts[0].nonzero().flatten().tolist() == [7]
    assert state.prompt_seen[0].nonzero().flatten().tolist() == [6]


def test_seeded_penalized_row_draws_the_same_alone_and_in_a_batch() -> None:
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(0))
    history = ([14, 12, 3], [12, 14, 14])  # the tokens this row draws unpenalized

    def draw(logits: torch.Tensor, row: int, slot: int, penalties: bool = True) -> int:
        """The token the seeded row draws at `row` of a batch of these logits, its history in `slot`."""
        rows = [RowSampling(temperature=1.0), RowSampling(temperature=0.0, logit_bias=LogitBias(
            np.array([1]), np.array([50.0], np.float32))), RowSampling(temperature=0.5, top_k=3)][: len(logits) - 1]
        rows.insert(row, RowSampling(temperature=0.8, seed=11, output_index=3, penalties=Penalties(
            slot, presence=0.4, frequency=0.6, repetition=1.4) if penalties else None))
        sampler = Sampler(CPU, seed=99, penalty_state=PenaltyState(8, VOCAB, CPU))
        return sampler(logits, rows, [PenaltySlotInit(slot, *history)]).token_ids[row]

    alone = [draw(logits[i : i + 1], 0, 0) for i in range(5)]
    batched = [draw(torch.cat([logits[(i + 1) % 5 :][:1], logits[i : i + 1], logits[:2]]), 1, 5) for i in range(5)]
    assert batched == alone
    # The penalties changed what was drawn: the comparison above is not vacuous.
    assert [draw(logits[i : i + 1], 0, 0, penalties=False) for i in range(5)] != alone
