"""The flash-attn backend: flash-attn's paged kernels when the package imports (CUDA only).

Decode-only batches use `flash_attn_with_kvcache` (one query per row, paged through the block
table); other batches use `flash_attn_varlen_func` with `block_table`, whose causal mask is aligned
bottom-right, i.e. a row's queries are its last tokens, as in our reference. New K/V are written by
our Triton `store_kv` kernel.

flash-attn 2 only reads paged caches whose block size is a multiple of 256, so `check_block_size`
refuses other sizes at start-up and `auto` picks the Triton backend for them.
"""

import torch
from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

from gpu.attention.metadata import AttentionMetadata
from gpu.kernels.store_kv import store_kv

PAGED_BLOCK_MULTIPLE = 256


def check_block_size(block_size: int) -> None:
    if block_size % PAGED_BLOCK_MULTIPLE:
        raise ValueError(
            f"the flash-attn backend needs a KV block size that is a multiple of {PAGED_BLOCK_MULTIPLE} "
            f"(got {block_size}); use --block-size 256 or the triton backend"
        )


class FlashAttnBackend:
    name = "flash-attn"
    supports_cuda_graphs = True

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if meta.is_decode_only:
            out = flash_attn_with_kvcache(
                query.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.context_lens,
                block_table=meta.block_tables, softmax_scale=scale, causal=True,
            )
            return out.squeeze(1)
        cu_seqlens_k = torch.nn.functional.pad(meta.context_lens.cumsum(0, dtype=torch.int32), (1, 0))
        return flash_attn_varlen_func(
            query, k_cache, v_cache, cu_seqlens_q=meta.query_start_loc, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=meta.max_query_len, max_seqlen_k=meta.max_context_len, softmax_scale=scale,
            causal=True, block_table=meta.block_tables,
        )
