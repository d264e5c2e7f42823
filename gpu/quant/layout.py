"""Where a linear layer's weight sits in its checkpoint tensors, and how any format's part of a tensor is read.

A linear layer holds rows (output features) of one or more checkpoint tensors (a merged q/k/v holds three, each a
`RowSlice` of its tensor, a share of it under tensor parallelism) and a range of its columns (input features: a
row-parallel layer's share). A quantized format stores each of its tensors packed or grouped along those two
dimensions; a `TensorLayout` says which dimension of the stored tensor runs along the rows and which along the
columns, and how many rows or columns one stored element spans, so one rule reads any format's part of a tensor.
"""

from dataclasses import dataclass

import torch

from gpu.loader import CheckpointTensor


@dataclass(frozen=True)
class RowSlice:
    """Rows [start, start + size) of a checkpoint tensor that has `total` rows."""

    start: int
    size: int
    total: int

    @staticmethod
    def whole(total: int) -> "RowSlice":
        return RowSlice(0, total, total)


ColumnSlice = RowSlice  # the same range, along the input features


@dataclass(frozen=True)
class WeightLayout:
    """A linear layer's weight [out_features, in_features]: each checkpoint shard's rows, in order (None: the layer's
    one tensor), and the columns it holds of them all."""

    shards: dict[str | None, RowSlice]
    columns: ColumnSlice

    @property
    def out_features(self) -> int:
        return sum(rows.size for rows in self.shards.values())

    @property
    def in_features(self) -> int:
        return self.columns.size

    def checkpoint_rows(self, shard: str | None) -> list[tuple[str | None, RowSlice]]:
        """(the layer's shard, the rows it takes of the checkpoint tensor) of a tensor loaded as `shard`: that shard's
        rows; or, for a tensor holding every shard's rows in order (a fused q/k/v, `shard` None on a merged layer),
        each shard's rows within it."""
        if shard in self.shards:
            return [(shard, self.shards[shard])]
        if shard is not None:
            raise ValueError(f"no shard {shard!r} in a layer of shards {list(self.shards)}")
        rows, start, total = [], 0, sum(r.total for r in self.shards.values())
        for name, part in self.shards.items():
            rows.append((name, RowSlice(start + part.start, part.size, total)))
            start += part.total
        return rows

    def shard_start(self, shard: str | None) -> int:
        """The first of the layer's rows that `shard` fills."""
        start = 0
        for name, rows in self.shards.items():
            if name == shard:
                return start
            start += rows.size
        raise ValueError(f"no shard {shard!r} in a layer of shards {list(self.shards)}")


@dataclass(frozen=True)
class TensorLayout:
    """How a stored tensor runs along the weight: `row_dim` (None: the tensor is the same for every row) holds
    rows at `rows_per_unit[0]` rows for every `rows_per_unit[1]` elements (a pack of 8 int4 rows in one int32:
    (8, 1); a scale per block of 128 rows: (128, 1); GGUF's 256-column blocks of 144 bytes: (256, 144)), and
    `column_dim` likewise for columns."""

    row_dim: int | None
    column_dim: int | None
    rows_per_unit: tuple[int, int] = (1, 1)
    columns_per_unit: tuple[int, int] = (1, 1)


PLAIN = TensorLayout(row_dim=0, column_dim=1)  # [out, in], one element per weight


def stored_range(weights: RowSlice, per_unit: tuple[int, int], what: str) -> tuple[int, int]:
    """(start, size) in stored elements of a range of weights, which must fall on the format's unit boundaries."""
    weights_per, elements_per = per_unit
    if weights.start % weights_per or (weights.size % weights_per and weights.start + weights.size != weights.total):
        raise ValueError(f"{what} [{weights.start}, {weights.start + weights.size}) does not fall on the format's "
                         f"units of {weights_per}")
    return weights.start // weights_per * elements_per, -(-weights.size // weights_per) * elements_per


def read_part(loaded: CheckpointTensor, layout: TensorLayout, rows: RowSlice, columns: ColumnSlice) -> torch.Tensor:
    """The elements of `loaded` that hold weights `rows` x `columns`."""
    ranges: dict[int, tuple[int, int]] = {}
    if layout.row_dim is not None:
        ranges[layout.row_dim] = stored_range(rows, layout.rows_per_unit, f"{loaded.name}: rows")
    if layout.column_dim is not None:
        ranges[layout.column_dim] = stored_range(columns, layout.columns_per_unit, f"{loaded.name}: columns")
    return loaded.read_ranges(ranges)
