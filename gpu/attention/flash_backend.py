"""The flash-attn backend: FlashAttention-4's CuTe-DSL kernels (`flash_attn.cute`, the `flash-attn-4`
package, extra `flash`) over our paged cache, on Hopper and newer GPUs.

Both phases call FA4's forward with the cache as pages (`page_table` = our block tables,
`seqused_k` = context lengths), so any block size works (pages that are not a whole key tile go
through its cp.async path):
- decode-only batches as [rows, 1, heads, dim] queries without causal masking (one query sees
  the whole context). Its grid depends only on shapes, so it can be captured in a CUDA graph.
- any other batch as varlen queries (`cu_seqlens_q` = query_start_loc) with causal masking
  aligned bottom-right: a row's queries are its last tokens, as in our reference. On Hopper its
  grid (FA4's SingleTileVarlenScheduler) is sized from the query tensor's token count and the
  number of rows, never from the lengths, which it reads on the device: a step padded to a token
  bucket and a row capacity (gpu/mixed_graphs.py, whose padding rows have no queries and no
  context) replays one captured graph. The longest query, a host integer, only picks a kernel
  variant (one query tile or more); the graphs pass their bucket, an upper bound. On other GPUs
  FA4 may size that grid from the longest query, so there such steps run eagerly.
New K/V are written by our Triton `store_kv` kernel. A layer's variant (gpu/attention/variant.py) maps onto FA4's
own arguments: a sliding window W is `window_size_left` = W - 1 with nothing to the right (FA4 then skips the KV
blocks wholly outside it), sinks are its `learnable_sink` (natural-log logits, unscaled, as ours), a soft-cap its
`softcap`. These change the compiled variant, not the grid, so graphs hold them as they hold plain layers.

We call FA4's `_flash_attn_fwd` (the function behind its public `flash_attn_varlen_func`) rather
than the public wrapper: it takes an output buffer, and skips the autograd Function around it,
which inference never needs. The version is pinned in pyproject's `flash` extra for that reason.
No split-KV: FA4 has none on SM90 (it asserts), so `num_splits` is always 1.

FA4 compiles each kernel variant at its first call (seconds). Compiled kernels are kept on disk
(`FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED`, set here unless the environment says otherwise), so a
second start of the server loads them; `compile_variants` compiles every variant our steps use,
so a server compiles nothing after it is ready.
"""

import os

import torch

# Read by flash_attn.cute when it is imported, so it must be set first.
os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")

from flash_attn.cute.interface import BIN_BATCH_SEARCH_THRESH, _flash_attn_fwd  # noqa: E402

from gpu.attention.metadata import AttentionMetadata  # noqa: E402
from gpu.attention.variant import PLAIN, AttentionVariant  # noqa: E402
from gpu.kernels.store_kv import store_kv  # noqa: E402

# With pack_gqa FA4 packs (queries x group) into tiles of 128 or 192 rows; a step whose longest
# query fits one tile runs another (persistent) kernel variant than longer ones.
_ROWS_PAST_ANY_TILE = 256


class FlashAttnBackend:
    name = "flash-attn"
    supports_cuda_graphs = True  # decode-only steps
    decodes_from_qkv = False

    def __init__(self) -> None:
        # Steps with prefill in CUDA graphs: only where the varlen grid is known not to depend on the lengths.
        self.supports_mixed_graphs = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9

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
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)  # contiguous, as FA4 writes it
        return self.attend(query, k_cache, v_cache, meta, scale, out, variant)

    def attend(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written in full
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:
        extras = _variant_arguments(variant)
        if meta.is_decode_only:
            _flash_attn_fwd(
                query.unsqueeze(1), k_cache, v_cache, seqused_k=meta.context_lens, page_table=meta.block_tables,
                softmax_scale=scale, causal=False, num_splits=1, out=out.unsqueeze(1), **extras,
            )
            return out
        _flash_attn_fwd(
            query, k_cache, v_cache, cu_seqlens_q=meta.query_start_loc, max_seqlen_q=meta.max_query_len,
            seqused_k=meta.context_lens, page_table=meta.block_tables, softmax_scale=scale, causal=True,
            num_splits=1, out=out, **extras,
        )
        return out

    def compile_variants(
        self, num_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float, max_num_seqs: int,
        variant: AttentionVariant = PLAIN,
    ) -> None:
        """Runs each kernel variant our steps can use once on a small batch (block 0 of the cache):
        decode, and varlen with a longest query inside one tile and past it (and more rows than
        FA4's lookup threshold when the scheduler allows that many), for layers of this shape and variant."""
        group = num_heads // k_cache.shape[2]
        batches = [[1, 1], [1, 2], [1, _ROWS_PAST_ANY_TILE // group + 1]]
        if max_num_seqs > BIN_BATCH_SEARCH_THRESH:
            batches.append([1] * BIN_BATCH_SEARCH_THRESH + [2])
        for query_lens in batches:
            query, meta = _small_batch(query_lens, num_heads, k_cache)
            self.forward(query, k_cache, v_cache, meta, scale, variant)


def _variant_arguments(variant: AttentionVariant) -> dict[str, object]:
    """FA4's arguments for a layer's window, sinks and soft-cap (none for plain attention)."""
    if variant.is_plain:
        return {}
    window = variant.sliding_window
    return {"window_size_left": None if window is None else window - 1,
            "window_size_right": None if window is None else 0,
            "learnable_sink": variant.sinks, "softcap": variant.softcap}


def _small_batch(
    query_lens: list[int], num_heads: int, k_cache: torch.Tensor
) -> tuple[torch.Tensor, AttentionMetadata]:
    """Rows whose context is their query, every block table entry block 0."""
    device, block_size, _, head_dim = k_cache.device, k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    num_rows, num_tokens, longest = len(query_lens), sum(query_lens), max(query_lens)
    starts = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=starts.to(device),
        context_lens=torch.tensor(query_lens, dtype=torch.int32, device=device),
        block_tables=torch.zeros(num_rows, -(-longest // block_size), dtype=torch.int32, device=device),
        max_query_len=longest, max_context_len=longest, is_decode_only=longest == 1,
    )
    return torch.randn(num_tokens, num_heads, head_dim, device=device).to(k_cache.dtype), meta
