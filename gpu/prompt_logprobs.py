"""Logprobs of prompt tokens (vLLM's `prompt_logprobs`, the legacy API's `echo` with `logprobs`).

From the hidden states a prefill step computes anyway: the state at prompt position p, through the
LM head, scores prompt token p + 1. Positions are taken in slices of SLICE so that a long prompt
never holds [prompt_len, vocab] float32 logits at once (1024 positions of a 152k vocabulary would
be 622 MB). The results travel to the host packed like sampled logprobs (gpu/sampler.py), with the
step's tokens, so they cost no extra host sync.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gpu.batch import PromptLogprobsRow
from gpu.host_to_device import to_device

SLICE = 256


@dataclass(frozen=True)
class PackedPromptLogprobs:
    """On the device, [num_targets, 3 + 2 * num_top] float64: target id, its logprob, rank, top ids, top logprobs."""

    packed: torch.Tensor
    counts: list[int]  # targets per row of the batch's prompt_logprobs
    num_tops: list[int]  # as asked, per row


def prompt_logprobs(hidden: torch.Tensor, rows: list[PromptLogprobsRow],
                    compute_logits: Callable[[torch.Tensor], torch.Tensor | None]) -> PackedPromptLogprobs | None:
    """hidden: [num_tokens, hidden_size], the step's. None on a tensor-parallel rank other than 0, whose
    `compute_logits` sends its share of each slice's logits to rank 0 and returns None."""
    positions = np.concatenate([np.arange(r.first_token_index, r.first_token_index + len(r.target_token_ids))
                                for r in rows])
    targets = np.concatenate([np.asarray(r.target_token_ids, dtype=np.int64) for r in rows])
    where = to_device(np.stack([positions, targets]), np.int64, hidden.device)  # [2, num_targets]
    num_top = max(r.num_top for r in rows)
    parts = []
    for start in range(0, len(targets), SLICE):
        index, target = where[0, start : start + SLICE], where[1, start : start + SLICE]
        logits = compute_logits(hidden[index])
        if logits is None:
            continue
        logprobs = logits.float().log_softmax(dim=-1)
        chosen = logprobs.gather(1, target.unsqueeze(1))
        ranks = (logprobs > chosen).sum(dim=-1, keepdim=True) + 1
        top_values, top_ids = logprobs.topk(num_top, dim=-1)
        parts.append(torch.cat([c.double() for c in (target.unsqueeze(1), chosen, ranks, top_ids, top_values)], 1))
    if not parts:
        return None
    return PackedPromptLogprobs(torch.cat(parts), [len(r.target_token_ids) for r in rows], [r.num_top for r in rows])
