"""Device tensors that describe one step's attention, built once per step by the runner.

KV cache layout, shared by every backend: one key and one value tensor per layer, each
[num_blocks, block_size, num_kv_heads, head_dim]. A token at cache slot s lives in block
s // block_size at offset s % block_size.

Each KV-cache group (gpu/kv_cache_groups.py) has its own block ids, so its own slot mapping and block tables; the
rest is the step's. The runner builds group 0's metadata with a view per other group (`other_groups`, sharing
the step's tensors) and a layer reads its group's (`of_group`); a one-group model has none.

A model with linear-attention layers (gpu/layers/gated_deltanet.py) also reads each row's state slot
(`linear_state`): the layers keep one state per sequence, not per token. The index tensors of its rows' pieces
(`PieceLevel`, `ConvWindows`) are built once per step and shared by every linear layer, which only indexes with them.

A step whose rows each have a few queries (a verifying step's k + 1) also lays each query out as a decode row of its
own (`query_rows`): causal by construction, since a query at position p sees the keys 0..p and the step's K/V are
stored before any layer's attention reads them. Built once per step on the device (no host sync, shapes fixed by
the step's), where the step's other metadata is made.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from gpu.host_to_device import to_device


@dataclass
class LinearStateMetadata:
    """Each row's state slot for the linear-attention layers, and whether the row continues its sequence's state
    (a later chunk, a decode) or starts it (its first token: the state read is zeros)."""

    slots: torch.Tensor  # [num_rows] int64
    keeps_state: torch.Tensor  # [num_rows] float32: 1.0 where the row continues its state, 0.0 where it starts
    # On the host, for the row-by-row path (empty in the decode graphs' inputs: a decode reads only the tensors):
    continues: tuple[bool, ...]  # keeps_state
    # Each row's tokens among the step's, in pieces [start, end) that end where its state is saved to a snapshot row
    # (None: the row's last piece, whose state stays in its slot only): (start, end, snapshot row or None).
    row_pieces: tuple[tuple[tuple[int, int, int | None], ...], ...]
    is_one_token_per_row: bool  # every row at once (a decode step), else row by row
    # A step with one-token rows and longer ones: each part's inputs and its tokens among the step's ([tokens] int64);
    # the one-token rows run at once, rows that verify drafts position by position, the others row by row. Empty: the
    # step is one part.
    parts: tuple[tuple["LinearStateMetadata", torch.Tensor], ...] = ()
    # Rows that verify drafts (speculative decoding): their i-th tokens run at once, for i = 0, 1, ..., as a decode
    # step of the rows that have one (the layer's one-token path), each row's state then copied to the state row that
    # keeps it after i + 1 tokens (its own slot where none does). Empty: not such rows.
    by_position: tuple["PositionStep", ...] = ()
    # Rows run row by row, their pieces' index tensors: built on the first linear layer's call, then shared by the
    # others (a step that does not run its rows so builds none; the conv windows need the model's kernel size).
    # `levels`: the k-th pieces of the rows that have one, for k = 0, 1, ... (the delta rule runs over a level at
    # once). None: every row of one token.
    levels: Callable[[], tuple["PieceLevel", ...]] | None = None
    conv_windows: Callable[[int], "ConvWindows"] | None = None
    # The same rows for the kernel that runs each row's tokens one after another (built and shared as `levels`), and
    # the most tokens of a row, which chooses between the two.
    sequential_rows: Callable[[], "SequentialRows"] | None = None
    max_row_tokens: int = 1


@dataclass
class PieceLevel:
    """The k-th pieces of the rows that have one (see LinearStateMetadata.row_pieces), packed one after another. The
    same tensor objects serve every layer: fla caches what it derives from cu_seqlens (its chunk indices, copied to
    the device) by the tensors' identity, so it derives them once per step too."""

    tokens: torch.Tensor | None  # [level_tokens] int64, the pieces' tokens among the part's; None: all, in order
    rows: torch.Tensor | None  # [level_rows] int64, the rows that have a k-th piece; None: every row
    cu_seqlens: torch.Tensor  # [level_rows + 1] int64 on the device: the pieces' bounds among the level's tokens
    cu_seqlens_cpu: torch.Tensor  # the same on the host
    # Pieces that end where a snapshot is saved: their positions among the level's rows ([saves] int64) and the
    # snapshot rows ([saves] int64). None: no piece of the level does.
    saves: tuple[torch.Tensor, torch.Tensor] | None


@dataclass
class SequentialRows:
    """The rows' pieces (see LinearStateMetadata.row_pieces) for gpu/kernels/gated_delta_rows.py, which carries each
    row's state through its pieces in order and stores it after each: views of one int64 device tensor."""

    row_starts: torch.Tensor  # [num_rows]: each row's first token among the part's
    row_pieces: torch.Tensor  # [num_rows + 1]: row r's pieces are [row_pieces[r], row_pieces[r + 1])
    piece_ends: torch.Tensor  # [num_pieces]: the token after each piece's last, among the part's
    piece_states: torch.Tensor  # [num_pieces]: the state row each piece's state is stored to (a snapshot or the slot)


@dataclass
class ConvWindows:
    """The rows' convolution as one: a window of each row's K - 1 conv-state inputs then its tokens, the windows
    packed one after another, gathered from [the rows' initial conv states, K - 1 inputs each; the tokens]."""

    # Both None for one row, whose window is its sources in order and whose outputs are the first num_tokens:
    gather: torch.Tensor | None  # [num_rows * (K - 1) + num_tokens] int64: each window column's source
    outputs: torch.Tensor | None  # [num_tokens] int64: each token's column among the convolution's outputs
    finals: torch.Tensor  # [num_rows, K - 1] int64: the window columns of each row's last K - 1 inputs
    # Where a snapshot is saved inside a row: the window columns of the K - 1 inputs before the cut ([saves, K - 1])
    # and the snapshot rows ([saves]). None: no row saves one inside it.
    saves: tuple[torch.Tensor, torch.Tensor] | None


@dataclass
class PositionStep:
    """The i-th token of each row that has one, among the part's tokens, its slot, whether it continues its state,
    and the state row its state is copied to after it."""

    tokens: torch.Tensor  # [rows] int64
    slots: torch.Tensor  # [rows] int64
    keeps_state: torch.Tensor  # [rows] float32
    saves_to: torch.Tensor  # [rows] int64


# Rows of at most this many queries each (verifying steps: k + 1 <= 9) attend as one decode row per query: the decode
# kernel splits each query's context over the GPU, where the prefill kernel gives a row a few programs that walk it all.
MAX_QUERIES_AS_ROWS = 16


@dataclass
class QueryRows:
    """A step's queries as decode rows, one a query, in the step's token order."""

    rows: torch.Tensor  # [num_tokens] int64: the row of each query
    context_lens: torch.Tensor  # [num_tokens] int32: its position + 1, the keys it sees
    block_tables: torch.Tensor  # [num_tokens, max_blocks_per_row] int32: its row's
    # Where every row has as many queries, that many (the decode kernel then runs a row's queries in one program,
    # reading its K/V once for all); else 1.
    queries_per_row: int = 1

    def with_tables(self, block_tables: torch.Tensor) -> "QueryRows":
        """The same queries reading the rows' `block_tables` (another KV-cache group's)."""
        return replace(self, block_tables=block_tables.index_select(0, self.rows))


def query_rows_of_uniform_rows(positions: torch.Tensor, block_tables: torch.Tensor) -> QueryRows:
    """The queries of rows that have as many each, at `positions` [num_rows, queries a row] (int64, on the device);
    `block_tables` the rows'. A few device ops (an eager step launches each), no host sync."""
    num_rows, num_queries = positions.shape
    rows = torch.arange(num_rows * num_queries, device=positions.device) // num_queries
    return QueryRows(rows, (positions.reshape(-1) + 1).to(torch.int32), block_tables.index_select(0, rows),
                     num_queries)


def query_rows_of_host_rows(query_lens: np.ndarray, context_lens: np.ndarray, block_tables: torch.Tensor
                            ) -> QueryRows:
    """The queries of rows laid out on the host: `query_lens` and `context_lens` [num_rows] (this step's tokens
    included); `block_tables` the rows', on the device. One copy to the device."""
    num_rows, num_tokens = len(query_lens), int(query_lens.sum())
    rows = np.repeat(np.arange(num_rows, dtype=np.int64), query_lens)
    first_token = np.repeat(np.cumsum(query_lens) - query_lens, query_lens)
    first_position = np.repeat(np.asarray(context_lens, dtype=np.int64) - query_lens, query_lens)
    lens = first_position + (np.arange(num_tokens, dtype=np.int64) - first_token) + 1
    both = to_device(np.concatenate([rows, lens]), np.int64, block_tables.device)
    device_rows = both[:num_tokens]
    is_uniform = num_rows > 0 and int(query_lens.min()) == int(query_lens.max())
    return QueryRows(device_rows, both[num_tokens:].to(torch.int32), block_tables.index_select(0, device_rows),
                     int(query_lens[0]) if is_uniform else 1)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; -1: padding, nothing written
    query_start_loc: torch.Tensor  # [num_rows + 1] int32, cumulative query lengths
    context_lens: torch.Tensor  # [num_rows] int32, tokens in the cache including this step's
    block_tables: torch.Tensor  # [num_rows, max_blocks_per_row] int32, padded with 0
    max_query_len: int
    max_context_len: int
    is_decode_only: bool
    # Decode only, optional: [num_rows] int32, the rows by descending context length. The decode kernel
    # launches the rows in this order so the longest finish first instead of forming the tail.
    row_order: torch.Tensor | None = None
    linear_state: LinearStateMetadata | None = None  # only for a model with linear-attention layers
    # Rows of at most MAX_QUERIES_AS_ROWS queries, not one each: the queries as decode rows (see the module's doc).
    # None: not such a step, or one laid out without them (a mixed-step graph's).
    query_rows: QueryRows | None = None
    # The views of groups 1, 2, ...: this metadata is group 0's.
    other_groups: tuple["AttentionMetadata", ...] = ()

    def of_group(self, group: int) -> "AttentionMetadata":
        """The metadata of a layer of KV-cache group `group`."""
        return self if group == 0 else self.other_groups[group - 1]

    def with_group_tables(self, slot_mappings: list[torch.Tensor], block_tables: list[torch.Tensor]
                          ) -> "AttentionMetadata":
        """This step's metadata with a view per further group: group g + 1 writes `slot_mappings[g]` and reads
        `block_tables[g]`."""
        views = tuple(replace(self, slot_mapping=slots, block_tables=tables,
                              query_rows=None if self.query_rows is None else self.query_rows.with_tables(tables))
                      for slots, tables in zip(slot_mappings, block_tables, strict=True))
        return replace(self, other_groups=views)
