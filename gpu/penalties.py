"""Repetition penalties and logit bias, batched on the device, with each row's token counts kept there.

`PenaltyState` holds, per slot, the counts of the tokens a sequence has generated ([num_slots,
vocab] int32) and which tokens its prompt holds ([num_slots, vocab] bool). Core gives each
penalized sequence a slot. A slot is filled anew (`PenaltySlotInit`) at the sequence's first
sample and at its first after a preemption, from the tokens the host knows then; from there on
each step adds its sampled tokens on the device, queued right after the draw, so a token still in
flight is counted before the next step reads the table, and the host never waits for it.

Invariant: once a step's sampling is queued, counts[slot] is the bincount of its sequence's
generated tokens, that step's included. (A token drawn for a sequence that ended while the step
was in flight is counted in its freed slot; a slot is filled anew before it is used again, and
device order puts the fill after that count.)

Semantics, as vLLM applies them (in this order, after logit bias):
- repetition (transformers' RepetitionPenaltyLogitsProcessor, over prompt and output): a seen
  token's logit is divided by the penalty when positive, multiplied when negative;
- frequency and presence (OpenAI's, over generated tokens only):
  logit -= frequency * count + presence * (count > 0).
"""

from collections.abc import Sequence

import numpy as np
import torch

from gpu.batch import LogitBias, Penalties, PenaltySlotInit
from gpu.host_to_device import to_device


class PenaltyState:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device) -> None:
        self.num_slots = num_slots
        self.device = device
        self.output_counts = torch.zeros(num_slots, vocab_size, dtype=torch.int32, device=device)
        self.prompt_seen = torch.zeros(num_slots, vocab_size, dtype=torch.bool, device=device)

    def fill(self, inits: Sequence[PenaltySlotInit]) -> None:
        """Each slot emptied, then its prompt marked and its generated tokens counted: one copy to the device."""
        slots = np.fromiter((i.slot for i in inits), dtype=np.int64, count=len(inits))
        prompt_lens = np.fromiter((len(i.prompt_token_ids) for i in inits), dtype=np.int64, count=len(inits))
        output_lens = np.fromiter((len(i.output_token_ids) for i in inits), dtype=np.int64, count=len(inits))
        packed = to_device(np.concatenate([
            slots, np.repeat(slots, prompt_lens), *(i.prompt_token_ids for i in inits),
            np.repeat(slots, output_lens), *(i.output_token_ids for i in inits),
        ]).astype(np.int64), np.int64, self.device)
        slot_ids, prompt_slots, prompt_ids, output_slots, output_ids = packed.split(
            [len(inits), *[int(prompt_lens.sum())] * 2, *[int(output_lens.sum())] * 2])
        num_output = len(output_ids)
        self.output_counts[slot_ids] = 0
        self.prompt_seen[slot_ids] = False
        self.prompt_seen[prompt_slots, prompt_ids] = True
        ones = torch.ones(num_output, dtype=torch.int32, device=self.device)
        self.output_counts.index_put_((output_slots, output_ids), ones, accumulate=True)

    def apply(self, logits: torch.Tensor, where: torch.Tensor | None, penalties: Sequence[Penalties],
              use_kernel: bool = False) -> None:
        """Penalizes logits[where] (float32, in place; `where` None: every row), one entry of `penalties` per row.
        `use_kernel`: in one pass of gpu/kernels/penalties.py (CUDA with triton), else with the torch code below,
        which is the reference: both give the same floats."""
        slots, values = self._row_tensors(penalties)
        uses_prompt = any(p.uses_prompt for p in penalties)
        uses_counts = any(p.frequency != 0.0 or p.presence != 0.0 for p in penalties)
        if use_kernel:
            from gpu.kernels.penalties import apply_penalties

            rows = torch.arange(len(penalties), device=self.device) if where is None else where
            apply_penalties(logits, rows, slots, values, self.output_counts, self.prompt_seen, uses_prompt,
                            uses_counts)
        else:
            self._apply_torch(logits, where, slots, values, uses_prompt, uses_counts)

    def _apply_torch(self, logits: torch.Tensor, where: torch.Tensor | None, slots: torch.Tensor,
                     values: torch.Tensor, uses_prompt: bool, uses_counts: bool) -> None:
        rows = logits if where is None else logits[where]  # [num_penalized, vocab]
        counts = self.output_counts[slots]  # [num_penalized, vocab]
        is_generated = counts > 0
        if uses_prompt:
            repetition = values[:, 2:3]
            is_seen = is_generated | self.prompt_seen[slots]
            rows = torch.where(is_seen, torch.where(rows < 0, rows * repetition, rows / repetition), rows)
        if uses_counts:
            rows = rows - values[:, 1:2] * counts - values[:, 0:1] * is_generated
        if where is None:
            logits.copy_(rows)
        else:
            logits[where] = rows

    def count(self, token_ids: torch.Tensor, where: torch.Tensor | None, penalties: Sequence[Penalties]) -> None:
        """Adds each penalized row's sampled token to its slot's counts (token_ids: [num_rows] on the device)."""
        slots = to_device([p.slot for p in penalties], np.int64, self.device)
        sampled = token_ids if where is None else token_ids[where]
        ones = torch.ones(len(penalties), dtype=torch.int32, device=self.device)
        self.output_counts.index_put_((slots, sampled), ones, accumulate=True)

    def _row_tensors(self, penalties: Sequence[Penalties]) -> tuple[torch.Tensor, torch.Tensor]:
        slots = to_device([p.slot for p in penalties], np.int64, self.device)
        values = to_device([(p.presence, p.frequency, p.repetition) for p in penalties], np.float32, self.device)
        return slots, values  # [num_penalized], [num_penalized, 3]


def apply_logit_bias(logits: torch.Tensor, row_indices: Sequence[int], biases: Sequence[LogitBias]) -> None:
    """logits[row, token] += value for every entry of each biased row (float32, in place); one copy to the device."""
    lengths = np.fromiter((len(b.token_ids) for b in biases), dtype=np.int64, count=len(biases))
    rows = np.repeat(np.asarray(row_indices, dtype=np.int64), lengths)
    where = to_device(np.stack([rows, np.concatenate([b.token_ids for b in biases])]), np.int64, logits.device)
    values = to_device(np.concatenate([b.values for b in biases]), np.float32, logits.device)
    logits.index_put_((where[0], where[1]), values, accumulate=True)
