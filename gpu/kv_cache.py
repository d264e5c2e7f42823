"""Sizing and allocating the paged KV cache: one key and one value tensor per layer.

Each tensor is [num_blocks, block_size, num_kv_heads, head_dim], with each layer's own head count and size; a
layer that reads another layer's cache (Gemma 4's shared KV) gets none. Sizing: an explicit block count
wins; on CUDA, what `gpu_memory_utilization` leaves after the weights and the peak activation
memory of a warm-up pass; on CPU, enough for `max_num_seqs` full contexts, capped by a byte budget.
"""

import logging

import torch

from gpu.layers.attention import DecoderAttention

logger = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 4 * 1024**3


def bytes_per_block(layers: list[DecoderAttention], block_size: int, dtype: torch.dtype) -> int:
    element_size = torch.empty(0, dtype=dtype).element_size()
    per_token = sum(2 * layer.num_kv_heads * layer.head_dim for layer in layers if layer.owns_kv_cache)
    return per_token * block_size * element_size


def num_blocks_for_cpu(block_bytes: int, block_size: int, max_num_seqs: int, max_model_len: int) -> int:
    blocks_for_full_contexts = max_num_seqs * -(-max_model_len // block_size)
    return max(1, min(blocks_for_full_contexts, CPU_KV_CACHE_BYTES // block_bytes))


def num_blocks_for_cuda(block_bytes: int, gpu_memory_utilization: float, device: torch.device) -> int:
    """Call after a warm-up pass at the largest batch shape, so its peak is in the statistics."""
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_allocated(device)
    available = int(total * gpu_memory_utilization) - used_by_others - peak
    if available < block_bytes:
        raise RuntimeError(
            f"no memory left for the KV cache: {total / 2**30:.1f} GiB total, utilization "
            f"{gpu_memory_utilization}, peak {peak / 2**30:.1f} GiB, other processes {used_by_others / 2**30:.1f} GiB"
        )
    return available // block_bytes


def allocate(
    layers: list[DecoderAttention], num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> None:
    for layer in layers:
        if not layer.owns_kv_cache:
            continue
        shape = (num_blocks, block_size, layer.num_kv_heads, layer.head_dim)
        layer.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        layer.v_cache = torch.zeros(shape, dtype=dtype, device=device)
