"""Attention on a CPU: the torch reference's math in fewer operations per layer.

At batch 1 a CPU decode step runs every layer's attention as a few dozen small torch calls, each
costing microseconds of dispatch, so the reference's general path (boolean masks for the cache
writes, keys and values repeated for every query head, einsums, a causal mask even for a single
query) costs more than the arithmetic. Here:
- the cache write is one `index_copy_` per tensor when the step has no padding slots (-1) and the cache is not
  FP8, else the reference's masked write;
- a row with one query (a decode) reads its context (the window's, for a windowed layer) through its block
  table, groups the query heads by the KV head they read (no repeat), and takes two batched matmuls and a
  float32 softmax; a single query sees every key it reads, so there is no mask;
- a row with more queries (a prefill chunk) takes the reference's path: its matmuls dominate.
The math is the reference's (float32 scores and softmax, the output rounded to the query's dtype), in
another summation order: results equal it to float32 rounding (tests/unit/test_cpu_attention.py).

Built with the C kernels of gpu/cpu_kernels/attention.c, a layer of plain or sliding-window attention (no sinks or
soft-cap) attends every single-query row of a step in one call of `decode_attention` (same math, its own summation
order), and only prefill rows take the torch code.
"""

from types import ModuleType

import torch

from gpu.attention import torch_ref
from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import PLAIN, AttentionVariant


class CpuBackend:
    name = "cpu"
    supports_cuda_graphs = False  # per-row host loops
    supports_mixed_graphs = False

    def __init__(self, kernels: ModuleType | None = None) -> None:
        """kernels: gpu/cpu_kernels/attention.c built for this CPU; None: the torch code only."""
        self.kernels = kernels

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:  # noqa: ANN001
        if (slot_mapping.numel() and int(slot_mapping.min()) < 0) or k_cache.dtype == torch.float8_e4m3fn:
            torch_ref.store_kv(key, value, k_cache, v_cache, slot_mapping)  # (index_copy_ takes no FP8 on a CPU)
            return
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))

    def forward(self, query, k_cache, v_cache, meta, scale, variant=PLAIN) -> torch.Tensor:  # noqa: ANN001
        if self.kernels is None or not is_windowed_at_most(variant) or not can_take(query, k_cache):
            return paged_attention(query, k_cache, v_cache, meta, scale, variant)
        out = torch.empty_like(query)
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        self.kernels.decode_attention(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), meta.block_tables.data_ptr(),
            meta.block_tables.stride(0), meta.context_lens.data_ptr(), meta.query_start_loc.data_ptr(),
            meta.context_lens.shape[0], block_size, query.shape[1], num_kv_heads, head_dim, scale,
            int(query.dtype == torch.bfloat16), variant.sliding_window or 0)
        if not meta.is_decode_only:
            paged_attention(query, k_cache, v_cache, meta, scale, variant, out=out, skips_single_queries=True)
        return out


def is_windowed_at_most(variant: AttentionVariant) -> bool:
    """Whether the C kernel computes this variant: plain attention, or within a sliding window (no sinks, no
    soft-cap)."""
    return variant.sinks is None and variant.softcap is None


def can_take(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the C kernel reads these tensors: contiguous, float32 or bfloat16 alike."""
    return (query.dtype == k_cache.dtype and query.dtype in (torch.float32, torch.bfloat16) and query.is_contiguous()
            and k_cache.is_contiguous())


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    variant: AttentionVariant = PLAIN,
    out: torch.Tensor | None = None,
    skips_single_queries: bool = False,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Into `out` where given; `skips_single_queries`: rows with one query are left as they are in `out`."""
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    out = torch.empty_like(query) if out is None else out
    starts = meta.query_start_loc.tolist()
    for row, context_len in enumerate(meta.context_lens.tolist()):
        start, end = starts[row], starts[row + 1]
        if end == start or (skips_single_queries and end - start == 1):
            continue
        first_visible = variant.first_visible(context_len - (end - start))
        first_block = first_visible // block_size
        blocks = meta.block_tables[row, first_block : (context_len + block_size - 1) // block_size]
        # [keys read, num_kv_heads, head_dim]; index_select: a quarter of advanced indexing's dispatch cost
        key_start = first_block * block_size
        keys = k_cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[: context_len - key_start]
        values = v_cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[: context_len - key_start]
        if end - start == 1:
            seen = first_visible - key_start  # a decode sees every key from its window's start
            out[start] = _attend_one_query(query[start], keys[seen:], values[seen:], scale, variant)
        else:
            out[start:end] = torch_ref.attend_row(query[start:end].float(), keys.float(), values.float(),
                                                  query.shape[1] // num_kv_heads, scale, variant,
                                                  key_start).to(query.dtype)
    return out


def _attend_one_query(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                      variant: AttentionVariant) -> torch.Tensor:
    """query: [num_heads, head_dim]; keys, values: [num_keys, num_kv_heads, head_dim], every one of them seen."""
    num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    grouped = query.float().view(num_kv_heads, num_heads // num_kv_heads, head_dim)  # heads of one KV head together
    scores = torch.bmm(grouped, keys.float().permute(1, 2, 0)).mul_(scale)  # [num_kv_heads, group, num_keys]
    if variant.softcap is not None:
        scores = torch.tanh(scores / variant.softcap) * variant.softcap
    if variant.sinks is None:
        probs = scores.softmax(dim=-1)
    else:  # the sink joins the denominator only
        sinks = variant.sinks.float().view(num_kv_heads, -1, 1)
        probs = torch.cat((scores, sinks), dim=-1).softmax(dim=-1)[..., :-1]
    out = torch.bmm(probs, values.float().transpose(0, 1))  # [num_kv_heads, group, head_dim]
    return out.view(num_heads, head_dim).to(query.dtype)
