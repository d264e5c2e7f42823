"""Sizing and allocating the paged KV cache: per KV-cache group (gpu/kv_cache_groups.py), one key and one value
tensor per layer of the group.

Each tensor is [num_blocks, block_size, num_kv_heads, head_dim], with its layer's own head count and size, and one
block more in a windowed group: its null block (zeros, never written). A layer that reads another layer's cache
(Gemma 4's shared KV) gets none.

Sizing, in blocks per group: an explicit block count is the full-attention group's, and each windowed group's up to
what that group can ever hold (`windowed_need`). Otherwise a byte budget is split (`split_budget`): on CUDA what
`gpu_memory_utilization` leaves after the weights and the peak activation memory of a warm-up pass, all of it used;
on CPU up to CPU_KV_CACHE_BYTES, and no more than the groups can ever hold (max_num_seqs full contexts for the
full-attention group). Windowed groups come first, each with what it can ever hold, or, when the budget is short,
the same share of that for each of them after one full context is set aside for the full-attention group; the
full-attention group gets the rest (on CUDA what is beyond its need serves the prefix cache), or, without one, the
windowed groups share it.
"""

import logging
from collections.abc import Sequence

import torch

from gpu.config import RunnerConfig
from gpu.kv_cache_groups import windowed_need
from gpu.layers.attention import DecoderAttention

logger = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 4 * 1024**3


def bytes_per_block(layers: list[DecoderAttention], block_size: int, dtype: torch.dtype) -> int:
    element_size = torch.empty(0, dtype=dtype).element_size()
    per_token = sum(2 * layer.num_kv_heads * layer.head_dim for layer in layers if layer.owns_kv_cache)
    return per_token * block_size * element_size


def group_bytes_per_block(layers: list[DecoderAttention], num_groups: int, block_size: int, dtype: torch.dtype
                          ) -> list[int]:
    """One block's bytes in each group: the caches of its layers (by `kv_group`)."""
    return [bytes_per_block([layer for layer in layers if layer.kv_group == group], block_size, dtype)
            for group in range(num_groups)]


def group_needs(windows: Sequence[int | None], config: RunnerConfig) -> list[int]:
    """The most blocks each group can ever hold: max_num_seqs full contexts, or a windowed group's bound."""
    c = config
    full = c.max_num_seqs * -(-c.max_model_len // c.block_size)
    return [full if w is None else windowed_need(w, c.block_size, c.max_num_seqs, c.max_model_len,
                                                 c.max_num_batched_tokens) for w in windows]


def explicit_blocks(num_blocks: int, windows: Sequence[int | None], config: RunnerConfig) -> list[int]:
    """The given count for the full-attention group; a windowed group's no more than it can ever hold."""
    return [num_blocks if w is None else min(num_blocks, need)
            for w, need in zip(windows, group_needs(windows, config), strict=True)]


def split_budget(available: int, windows: Sequence[int | None], block_bytes: Sequence[int], config: RunnerConfig,
                 uses_all: bool) -> list[int]:
    """Blocks per group in `available` bytes (see the module's docstring); `uses_all`: beyond every need too.
    A count may come out 0 when the budget is too small: the caller decides what that means."""
    needs = group_needs(windows, config)
    windowed = [g for g, w in enumerate(windows) if w is not None]
    full = 0 if windows[0] is None else None
    available -= sum(block_bytes[g] for g in windowed)  # the null blocks
    counts = [0] * len(windows)
    windowed_bytes = sum(needs[g] * block_bytes[g] for g in windowed)
    if windowed:
        context = -(-config.max_model_len // config.block_size)
        set_aside = 0 if full is None else min(context, needs[full]) * block_bytes[full]
        share = min(1.0, max(0, available - set_aside) / windowed_bytes)
        for g in windowed:
            counts[g] = int(needs[g] * share)
    left = max(0, available - sum(counts[g] * block_bytes[g] for g in windowed))
    if full is not None:
        counts[full] = left // block_bytes[full] if uses_all else min(needs[full], left // block_bytes[full])
    elif uses_all:
        for g in windowed:
            counts[g] += needs[g] * left // windowed_bytes
    return counts


def available_bytes_on_cuda(gpu_memory_utilization: float, device: torch.device) -> int:
    """What `gpu_memory_utilization` leaves for the KV cache. Call after a warm-up pass at the largest batch shape,
    so its peak is in the statistics."""
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_allocated(device)
    available = int(total * gpu_memory_utilization) - used_by_others - peak
    # What the cache is sized from, as vLLM logs it: where a smaller cache than expected comes from.
    logger.info("GPU memory: %.2f GiB total, utilization %.2f; peak allocated %.2f GiB (the weights, the warm-up's "
                "activations), %.2f GiB reserved but not allocated, %.2f GiB used by others; %.2f GiB for the KV cache",
                total / 2**30, gpu_memory_utilization, peak / 2**30,
                (torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)) / 2**30,
                used_by_others / 2**30, available / 2**30)
    return available


def num_blocks_per_group(config: RunnerConfig, windows: Sequence[int | None], block_bytes: Sequence[int],
                         device: torch.device) -> list[int]:
    """Each group's blocks (see the module's docstring). On CUDA, without an explicit count, call after a warm-up
    pass at the largest batch shape, so its peak is in the statistics."""
    if config.num_kv_blocks is not None:
        return explicit_blocks(config.num_kv_blocks, windows, config)
    if device.type != "cuda":
        return [max(1, n) for n in split_budget(CPU_KV_CACHE_BYTES, windows, block_bytes, config, uses_all=False)]
    available = available_bytes_on_cuda(config.gpu_memory_utilization, device)
    counts = split_budget(available, windows, block_bytes, config, uses_all=True)
    if min(counts) < 1:
        total = torch.cuda.mem_get_info(device)[1]
        raise RuntimeError(f"no memory left for the KV cache: {total / 2**30:.1f} GiB total, utilization "
                           f"{config.gpu_memory_utilization}, {available / 2**30:.2f} GiB left for it after the "
                           f"weights, activations and other processes")
    return counts


def allocate(layers: list[DecoderAttention], num_blocks: Sequence[int], windows: Sequence[int | None],
             block_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """Each cache-owning layer's tensors, for its group's blocks (and a windowed group's null block)."""
    for layer in layers:
        if not layer.owns_kv_cache:
            continue
        group = layer.kv_group
        shape = (num_blocks[group] + (windows[group] is not None), block_size, layer.num_kv_heads, layer.head_dim)
        layer.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        layer.v_cache = torch.zeros(shape, dtype=dtype, device=device)
