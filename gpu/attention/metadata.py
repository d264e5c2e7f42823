"""Device tensors that describe one step's attention, built once per step by the runner.

KV cache layout, shared by every backend: one key and one value tensor per layer, each
[num_blocks, block_size, num_kv_heads, head_dim]. A token at cache slot s lives in block
s // block_size at offset s % block_size.
"""

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; -1: padding, nothing written
    query_start_loc: torch.Tensor  # [num_rows + 1] int32, cumulative query lengths
    context_lens: torch.Tensor  # [num_rows] int32, tokens in the cache including this step's
    block_tables: torch.Tensor  # [num_rows, max_blocks_per_row] int32, padded with 0
    max_query_len: int
    max_context_len: int
    is_decode_only: bool
    # Decode only, optional: [num_rows] int32, the rows by descending context length. The decode kernel
    # launches the rows in this order so the longest finish first instead of forming the tail.
    row_order: torch.Tensor | None = None
