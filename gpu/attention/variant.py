"""What one layer's attention adds to plain causal softmax attention: a sliding window, attention sinks, a
soft-cap on the scores. Every backend takes it beside the step's metadata; a layer holds its own (gpu/layers/
attention.py). Plain attention is `PLAIN`.

- sliding_window W: a query at position p sees the keys at positions (p - W, p], as transformers masks it
  (`kv_idx > q_idx - sliding_window`). The torch, cpu and Triton backends read no KV block that lies wholly before
  a row's window, not even its block-table entry; FA4 skips the KV tiles wholly before it, and may read the blocks
  of the tile holding its start, whose values the mask discards. So the entries of a row's table before its window
  may name any block that exists (blocks a windowed layer no longer needs can be freed and reused).
- sinks: one logit per query head (gpt-oss), in the units of the scaled scores, that joins every softmax's
  denominator and no numerator: out = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)).
- softcap c (Gemma 2): scores become c * tanh(scores / c) after scaling, before the mask.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionVariant:
    sliding_window: int | None = None
    sinks: torch.Tensor | None = None  # [num_heads] of this rank's heads, any float dtype
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {self.sliding_window}")
        if self.softcap is not None and self.softcap <= 0:
            raise ValueError(f"softcap must be positive, got {self.softcap}")

    @property
    def is_plain(self) -> bool:
        return self.sliding_window is None and self.sinks is None and self.softcap is None

    def first_visible(self, position: int) -> int:
        """The first key position a query at `position` sees."""
        return 0 if self.sliding_window is None else max(0, position - self.sliding_window + 1)


PLAIN = AttentionVariant()
