"""The Triton attention backend: our own kernels on CUDA.

Routing: a decode-only batch (one query per row) goes to the split-KV decode kernel; any other
batch (prefill chunks, prefix-cache hits, mixed prefill + decode rows) to the varlen prefill kernel,
which treats decode rows as rows of query length 1. Both paths read only static facts on the host
(tensor shapes, the is_decode_only flag), never lengths, and allocate their scratch with
torch.empty, so both are safe to capture in a CUDA graph (the graph's pool owns the scratch): the
prefill kernel's grid is an upper bound from the token and row counts, and rows with no queries
(the padding rows of a captured mixed step) exit at once. A decode-only step may instead hand its layer's raw QKV
projection to decode_from_qkv: one kernel then norms and rotates the queries and keys, stores the step's K/V and
attends (gpu/kernels/fused_decode_attention.py), where the layer would launch qk_norm_rope_store_kv and then
decode_attention.
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
from gpu.attention.qkv_heads import QkvHeads
from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.kernels.decode_attention import decode_attention
from gpu.kernels.fused_decode_attention import fused_decode_attention
from gpu.kernels.prefill_attention import prefill_attention
from gpu.kernels.store_kv import store_kv


class TritonBackend:
    name = "triton"
    supports_cuda_graphs = True
    supports_mixed_graphs = True
    decodes_from_qkv = True

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
        return prefill_attention(
            query, k_cache, v_cache, meta.query_start_loc, meta.context_lens, meta.block_tables, scale,
            variant=variant,
        )

    def decode_from_qkv(
        self,
        qkv: torch.Tensor,  # [num_rows, columns of the heads], one token per row
        positions: torch.Tensor,  # [num_rows] int64
        layout: QkvHeads,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,  # a decode-only step's
        scale: float,
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:  # [num_rows, num_heads, head_dim]
        return fused_decode_attention(
            qkv, positions, layout, (*kv_cache, meta.slot_mapping), (meta.block_tables, meta.context_lens,
                                                                     meta.row_order), scale, variant, use_pdl=True,
        )
