"""Host-to-device copies that never make the host wait for the device.

A copy from pageable host memory may synchronize with the stream (the driver stages it), which
would stall the host until the device finishes the step in flight and undo async scheduling; so
every per-step input goes through pinned memory, whose copy is queued like a kernel.
"""

from itertools import chain

import numpy as np
import torch

from gpu.batch import PackedBlockTables


def write_block_tables(out: np.ndarray, block_tables: list[list[int]] | PackedBlockTables) -> None:
    """Writes row i's block ids to out[i, :len(row)] with one vectorized scatter (not a numpy call per row);
    entries past a row's blocks are left as they are: its context length bounds every read."""
    packed = pack_block_tables(block_tables, out.dtype)
    out[: len(packed)][np.arange(out.shape[1]) < packed.lengths[:, None]] = packed.block_ids


def pack_block_tables(block_tables: list[list[int]] | PackedBlockTables, dtype: np.dtype | type = np.int32
                      ) -> PackedBlockTables:
    if isinstance(block_tables, PackedBlockTables):
        return block_tables
    lengths = np.fromiter(map(len, block_tables), dtype=np.int64, count=len(block_tables))
    block_ids = np.fromiter(chain.from_iterable(block_tables), dtype=dtype, count=int(lengths.sum()))
    return PackedBlockTables(lengths, block_ids)


def to_device(array: np.ndarray | list, dtype: np.dtype | type, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(array, dtype=dtype))
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
