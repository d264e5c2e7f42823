"""Penalty states and rows shared by the penalty kernel's tests: on CUDA (tests/gpu/test_logit_adjustment_kernels.py)
and in Triton's interpreter on the CPU (tests/unit/test_logit_adjustment_kernels_interpreted.py)."""

from collections.abc import Callable

import torch

from gpu.batch import Penalties, PenaltySlotInit
from gpu.penalties import PenaltyState


def filled_state(num_slots: int, vocab: int, device: torch.device, prompt_len: int, output_id_range: int,
                 outputs_per_slot: int, seed: int = 0) -> PenaltyState:
    """Slot s holds a prompt of prompt_len + s random ids and outputs_per_slot * s outputs among the first
    output_id_range ids (so outputs repeat: the counts grow past 1)."""
    generator = torch.Generator().manual_seed(seed)
    state = PenaltyState(num_slots, vocab, device)
    state.fill([PenaltySlotInit(slot, torch.randint(0, vocab, (prompt_len + slot,), generator=generator).tolist(),
                                torch.randint(0, output_id_range, (outputs_per_slot * slot,),
                                              generator=generator).tolist())
                for slot in range(num_slots)])
    return state


def penalty_cases(num_slots: int) -> dict[str, Callable[[int], Penalties]]:
    """Row i's penalties, by case: every kind at once, one kind, and rows with none among rows with some."""
    return {
        "all": lambda i: Penalties(slot=(5 * i) % num_slots, presence=0.1 * i, frequency=0.3,
                                   repetition=1.0 + 0.07 * i),
        "repetition only": lambda i: Penalties(slot=i, repetition=1.3 + 0.1 * i),
        "counts only": lambda i: Penalties(slot=i, presence=-0.4, frequency=0.25 * i),
        "some rows plain": lambda i: Penalties(slot=i, presence=0.5 * (i % 2), repetition=1.0 + 0.2 * (i % 3 == 0)),
    }
