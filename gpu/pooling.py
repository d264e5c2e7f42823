"""Pooling: what a pooling model computes for a prompt instead of sampling a token.

A prompt's hidden states become one vector (`PoolingMethod`): its last token's (decoder embedding
models, yes/no rerankers), their mean, or its first token's (BERT's [CLS]). Then the model's head
(`PoolerHead`): `embed` returns the pooled vector as it is (normalization and Matryoshka truncation
are per request, the front end's); `classify` runs the model's classification head (a cross-encoder's
logits, one per label); `token_logits` returns the LM head's logits of a few tokens (a Qwen3-Reranker's
"no" and "yes"). Outputs are float32.

Chunked prompts are pooled exactly: a chunk that does not end its prompt leaves its state in the
row's pooling slot on the device (the sum of its hidden states so far for mean pooling, the first
token's for CLS; last-token pooling needs the last chunk only), and the chunk that ends it adds its
own. Nothing comes back to the host before a prompt's last chunk.
"""

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from gpu.batch import Batch, PoolingRow
from gpu.host_to_device import to_device


class PoolingMethod(StrEnum):
    LAST = "last"
    MEAN = "mean"
    CLS = "cls"


class PoolerHead(StrEnum):
    EMBED = "embed"
    CLASSIFY = "classify"
    TOKEN_LOGITS = "token_logits"


@dataclass(frozen=True)
class Pooler:
    method: PoolingMethod
    head: PoolerHead = PoolerHead.EMBED
    token_ids: tuple[int, ...] = ()  # token_logits: whose logits, in this order

    @property
    def needs_every_token(self) -> bool:
        """Whether every prompt token's hidden state counts: then none may come from the prefix cache."""
        return self.method is not PoolingMethod.LAST


class PoolingSlots:
    """The state of prompts pooled over several steps: one float32 row per slot, on the device."""

    def __init__(self, num_slots: int, hidden_size: int, device: torch.device) -> None:
        self.state = torch.zeros(num_slots, hidden_size, dtype=torch.float32, device=device)

    def pool(self, hidden: torch.Tensor, batch: Batch, method: PoolingMethod) -> torch.Tensor:
        """[rows that end their prompt, hidden_size] float32: each one's pooled hidden state. hidden: [num_tokens,
        hidden_size], the step's."""
        rows = batch.pooling
        ends = np.cumsum(batch.query_lens)
        row_ids = np.array([r.row for r in rows], dtype=np.int64)
        device = hidden.device
        if method is PoolingMethod.LAST:
            ending = row_ids[[r.ends_prompt for r in rows]]
            return hidden[to_device(ends[ending] - 1, np.int64, device)].float()
        if method is PoolingMethod.CLS:
            per_row = hidden[to_device(ends[row_ids] - np.asarray(batch.query_lens)[row_ids], np.int64, device)].float()
        else:
            token_rows = np.repeat(np.arange(batch.num_rows), batch.query_lens)
            sums = torch.zeros(batch.num_rows, hidden.shape[1], dtype=torch.float32, device=device)
            sums.index_add_(0, to_device(token_rows, np.int64, device), hidden.float())
            per_row = sums[to_device(row_ids, np.int64, device)]
        per_row = self._carry(per_row, rows, method)
        ending = [i for i, r in enumerate(rows) if r.ends_prompt]
        pooled = per_row[to_device(np.array(ending, dtype=np.int64), np.int64, device)]
        if method is PoolingMethod.MEAN:
            counts = np.array([rows[i].num_prompt_tokens for i in ending], dtype=np.float32)
            pooled = pooled / to_device(counts, np.float32, device)[:, None]
        return pooled

    def _carry(self, per_row: torch.Tensor, rows: list[PoolingRow], method: PoolingMethod) -> torch.Tensor:
        """Adds what earlier chunks left in the slots, and leaves the state of prompts not yet ended there."""
        carried = [(i, r.slot) for i, r in enumerate(rows) if not r.starts_prompt]
        if carried:
            indices, slots = (to_device(x, np.int64, per_row.device) for x in zip(*carried, strict=True))
            if method is PoolingMethod.MEAN:
                per_row = per_row.index_add(0, indices, self.state[slots])
            else:  # CLS: the first chunk's first token
                per_row = per_row.index_copy(0, indices, self.state[slots])
        kept = [(i, r.slot) for i, r in enumerate(rows) if not r.ends_prompt]
        if kept:
            indices, slots = (to_device(x, np.int64, per_row.device) for x in zip(*kept, strict=True))
            self.state[slots] = per_row[indices]
        return per_row
