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


class WrittenTables:
    """Which table each row of a host buffer's block-table region holds, by its sequence's table epoch
    (core/block_manager.py), so that a step rewrites only the rows whose tables changed since that buffer was last
    filled: a decoding row's table changes once a block's tokens, and converting every row's block ids from Python
    integers each step costs host time that grows with the context. One per buffer (a mirror filled in turn with
    another keeps its own); a fill in another layout of the buffer (`layout`: anything that moves the region) forgets
    every row."""

    def __init__(self) -> None:
        self._layout: object = None
        self._epochs = np.empty(0, dtype=np.int64)  # per row; -1: unknown

    def write(self, tables: np.ndarray, group_tables: list[list[list[int]] | PackedBlockTables], epochs: list[int],
              layout: object) -> None:
        """Writes the rows' tables of every group (`tables`: [groups, rows capacity, max blocks]) as
        write_block_tables would, skipping the rows whose epoch is the one this buffer's row holds."""
        num_rows = len(group_tables[0])
        if layout != self._layout or len(self._epochs) != tables.shape[1]:
            self._layout, self._epochs = layout, np.full(tables.shape[1], -1, dtype=np.int64)
        if len(epochs) != num_rows or any(isinstance(t, PackedBlockTables) for t in group_tables):
            for group, rows in enumerate(group_tables):  # epochs not known: every row, their epochs forgotten
                write_block_tables(tables[group, :num_rows], rows)
            self._epochs[:num_rows] = -1
            return
        now = np.fromiter(epochs, dtype=np.int64, count=num_rows)
        for row in np.flatnonzero(now != self._epochs[:num_rows]).tolist():
            for group, rows in enumerate(group_tables):
                table = rows[row]
                tables[group, row, : len(table)] = table  # type: ignore[index]
        self._epochs[:num_rows] = now


def to_device(array: np.ndarray | list, dtype: np.dtype | type, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(array, dtype=dtype))
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
