"""The Triton attention backend: our own kernels on CUDA.

Routing: a decode-only batch (one query per row) goes to the split-KV decode kernel, and so does a batch laid out
with its queries as decode rows (`query_rows`: rows of a few queries each, a verifying step's); any other
batch (prefill chunks, prefix-cache hits, mixed prefill + decode rows) to the varlen prefill kernel,
which treats decode rows as rows of query length 1. Both paths read only static facts on the host
(tensor shapes, the is_decode_only flag), never lengths, and allocate their scratch with
torch.empty, so both are safe to capture in a CUDA graph (the graph's pool owns the scratch): the
prefill kernel's grid is an upper bound from the token and row counts, and rows with no queries
(the padding rows of a captured mixed step) exit at once.
"""

import torch

try:
    import triton  # noqa: F401  (imported first for a clear message; the kernels need it)
except ImportError as error:
    raise ImportError(
        "the triton attention backend needs the `triton` package (pip install 'openai-serve[gpu]'); "
        "on CPU use the torch backend"
    ) from error

from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.kernels.decode_attention import decode_attention
from gpu.kernels.prefill_attention import prefill_attention
from gpu.kernels.store_kv import store_kv


class TritonBackend:
    name = "triton"
    supports_cuda_graphs = True
    supports_mixed_graphs = True

    def store_kv(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 skipped
    ) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        if meta.is_decode_only:
            return decode_attention(
                query, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, row_order=meta.row_order,
                use_pdl=True, variant=variant,
            )
        if meta.query_rows is not None:
            # Without PDL: a query's context holds the step's earlier tokens too, which the kernel before stores, and
            # under PDL the decode kernel reads all but a row's last token before it waits for that kernel.
            rows = meta.query_rows
            return decode_attention(query, k_cache, v_cache, rows.block_tables, rows.context_lens, scale,
                                    variant=variant, queries_per_row=rows.queries_per_row)
        return prefill_attention(
            query, k_cache, v_cache, meta.query_start_loc, meta.context_lens, meta.block_tables, scale,
            variant=variant,
        )
