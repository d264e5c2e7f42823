"""Plain torch attention over the paged cache: the CPU path, and the reference for every kernel.

Clarity over speed: a loop over rows (never over tokens), float32 softmax. A windowed layer's row reads
its context from the first block its earliest query sees (gpu/attention/variant.py).
"""

import torch

from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import PLAIN, AttentionVariant


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 skipped
) -> None:
    is_real = slot_mapping >= 0
    slots = slot_mapping[is_real]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = as_cache_dtype(key[is_real], k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = as_cache_dtype(value[is_real], v_cache.dtype)


def as_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a cache of `dtype` holds it: an FP8 cache saturates at its largest magnitude, as the Triton kernels'
    conversion does (some torch versions turn an overflowing value into NaN)."""
    if dtype == torch.float8_e4m3fn:
        largest = torch.finfo(dtype).max
        return x.clamp(-largest, largest).to(dtype)
    return x.to(dtype)


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [num_rows + 1]
    context_lens: torch.Tensor,  # [num_rows]
    block_tables: torch.Tensor,  # [num_rows, max_blocks]
    scale: float,
    variant: AttentionVariant = PLAIN,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Each row's queries are its last tokens; query j of a row sees keys up to its own position."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for row, context_len in enumerate(context_lens.tolist()):
        start, end = starts[row], starts[row + 1]
        if end == start:
            continue
        first_block = variant.first_visible(context_len - (end - start)) // block_size
        blocks = block_tables[row, first_block : (context_len + block_size - 1) // block_size].long()
        key_start = first_block * block_size
        keys = k_cache[blocks].flatten(0, 1)[: context_len - key_start].float()  # [keys read, kv_heads, head_dim]
        values = v_cache[blocks].flatten(0, 1)[: context_len - key_start].float()
        out[start:end] = attend_row(query[start:end].float(), keys, values, group, scale, variant,
                                    key_start).to(query.dtype)
    return out


def attend_row(
    query: torch.Tensor,  # [query_len, num_heads, head_dim]: the row's last query_len positions
    keys: torch.Tensor,  # [num_keys, num_kv_heads, head_dim]: positions key_start, key_start + 1, ...
    values: torch.Tensor,
    group: int,
    scale: float,
    variant: AttentionVariant = PLAIN,
    key_start: int = 0,
) -> torch.Tensor:
    query_len, context_len = query.shape[0], key_start + keys.shape[0]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) * scale
    if variant.softcap is not None:
        scores = torch.tanh(scores / variant.softcap) * variant.softcap
    device = query.device
    query_positions = torch.arange(context_len - query_len, context_len, device=device).unsqueeze(1)
    key_positions = torch.arange(key_start, context_len, device=device).unsqueeze(0)
    is_hidden = key_positions > query_positions  # [query_len, num_keys]
    if variant.sliding_window is not None:
        is_hidden |= key_positions <= query_positions - variant.sliding_window
    scores.masked_fill_(is_hidden, float("-inf"))
    if variant.sinks is None:
        return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)
    sinks = variant.sinks.float().view(-1, 1, 1).expand(-1, query_len, 1)  # [num_heads, query_len, 1]
    probs = torch.cat((scores, sinks), dim=-1).softmax(dim=-1)[..., :-1]  # the sink's share dropped
    return torch.einsum("hqk,khd->qhd", probs, values)


def attention_forward(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
    variant: AttentionVariant = PLAIN,
) -> torch.Tensor:
    return paged_attention(
        query, k_cache, v_cache, meta.query_start_loc, meta.context_lens, meta.block_tables, scale, variant
    )
