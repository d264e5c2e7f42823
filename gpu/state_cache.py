"""The state cache of linear-attention layers (gpu/layers/gated_deltanet.py): beside the paged KV cache, one conv
state and one recurrent state per layer for each of `num_slots` sequence slots. core/ gives each running sequence a
slot (the batch's `state_slots`); a step gathers its rows' states by slot and scatters them back. A row that starts
its sequence (its first token: a new prompt, or one recomputed after a preemption) reads zeros, so a freed slot
needs no clearing.

Prefix caching (core/state_snapshots.py) keeps states at block boundaries in further rows after the slots: a step
copies a snapshot into a slot before its forward, and a slot into a snapshot after it (`copy_rows`). On CUDA one
last row is the decode graphs' padded rows' (gpu/cuda_graphs.py), read as zeros and written, never used.

Sized before the KV cache, so the KV cache is sized from what the states leave.
"""

import numpy as np
import torch

from gpu.host_to_device import to_device
from gpu.layers.gated_deltanet import GatedDeltaNet

RECURRENT_DTYPE = torch.float32  # the delta rule adds into the state at every token: kept at full precision


def bytes_per_slot(layers: list[GatedDeltaNet], dtype: torch.dtype) -> int:
    element_size = torch.empty(0, dtype=dtype).element_size()
    recurrent_size = torch.empty(0, dtype=RECURRENT_DTYPE).element_size()
    total = 0
    for layer in layers:
        s = layer.spec
        total += s.conv_dim * (s.conv_kernel_size - 1) * element_size
        total += s.num_value_heads * s.key_head_dim * s.value_head_dim * recurrent_size
    return total


def allocate(layers: list[GatedDeltaNet], num_slots: int, dtype: torch.dtype, device: torch.device) -> None:
    for layer in layers:
        s = layer.spec
        layer.conv_state = torch.zeros(num_slots, s.conv_dim, s.conv_kernel_size - 1, dtype=dtype, device=device)
        layer.recurrent_state = torch.zeros(num_slots, s.num_value_heads, s.key_head_dim, s.value_head_dim,
                                            dtype=RECURRENT_DTYPE, device=device)


def copy_rows(layers: list[GatedDeltaNet], copies: list[tuple[int, int]], device: torch.device) -> None:
    """Every layer's state row `source` copied to row `destination`, for each (source, destination): one gather and
    one scatter per state tensor."""
    if not copies:
        return
    rows = to_device(np.asarray(copies, dtype=np.int64).T, np.int64, device)  # [2, num_copies]
    for layer in layers:
        layer.conv_state[rows[1]] = layer.conv_state[rows[0]]
        layer.recurrent_state[rows[1]] = layer.recurrent_state[rows[0]]
