"""Bidirectional attention for encoders (BERT, XLM-RoBERTa, ModernBERT): every token of a prompt sees
every other token of the same prompt (or those within a window), never another prompt's.

Encoders keep no KV cache: a prompt runs whole in one step and keeps nothing, so this attends over the
step's own keys and values. The paged backends (gpu/attention/) are causal over a cache; here torch's
scaled_dot_product_attention runs over the step's prompts padded to the longest one, with a key mask
(on CUDA its fused kernels, on a CPU its math). The padded layout is built on the device from the
step's metadata, once per step (`PaddedLayout`), with no host sync.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class PaddedLayout:
    """Where each of the step's tokens sits in a [num_rows, longest] padded batch."""

    padded_index: torch.Tensor  # [num_tokens] int64: row * longest + offset in row
    offsets: torch.Tensor  # [num_tokens] int64: the token's place in its prompt
    key_mask: torch.Tensor  # [num_rows, 1, 1, longest] bool: a real token
    num_rows: int
    longest: int

    @classmethod
    def of(cls, meta: AttentionMetadata, num_tokens: int) -> "PaddedLayout":
        starts = meta.query_start_loc.long()
        lengths = starts[1:] - starts[:-1]
        num_rows, longest = lengths.shape[0], meta.max_query_len
        device = starts.device
        rows = torch.repeat_interleave(torch.arange(num_rows, device=device), lengths, output_size=num_tokens)
        offsets = torch.arange(num_tokens, device=device) - starts[rows]
        key_mask = torch.arange(longest, device=device)[None, :] < lengths[:, None]
        return cls(rows * longest + offsets, offsets, key_mask[:, None, None, :], num_rows, longest)

    def window_mask(self, half_window: int) -> torch.Tensor:
        """[num_rows, 1, longest, longest]: keys within `half_window` places of the query (either side)."""
        places = torch.arange(self.longest, device=self.key_mask.device)
        band = (places[:, None] - places[None, :]).abs() <= half_window
        # A padding query whose band holds no real key would get no weights at all (NaN): it sees itself.
        return (band & self.key_mask) | torch.eye(self.longest, dtype=torch.bool, device=band.device)


def encoder_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PaddedLayout,
                      scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """query, key, value: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads * head_dim].
    `mask`: [num_rows, 1, longest, longest] (a window); None: the key mask alone."""
    num_tokens, num_heads, head_dim = query.shape
    padded = [_padded(x, layout) for x in (query, key, value)]  # [num_rows, num_heads, longest, head_dim]
    out = F.scaled_dot_product_attention(*padded, attn_mask=layout.key_mask if mask is None else mask, scale=scale)
    out = out.transpose(1, 2).reshape(layout.num_rows * layout.longest, num_heads * head_dim)
    return out[layout.padded_index]


def _padded(x: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
    num_tokens, num_heads, head_dim = x.shape
    padded = x.new_zeros(layout.num_rows * layout.longest, num_heads, head_dim)
    padded[layout.padded_index] = x
    return padded.view(layout.num_rows, layout.longest, num_heads, head_dim).transpose(1, 2)
