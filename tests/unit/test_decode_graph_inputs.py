"""Decode graphs' static inputs per KV-cache group, on CPU (their host side: the graphs themselves are tested in
tests/gpu): a decode step fills each group's slots and block tables where the graph's metadata views of that group
read them, its padded rows writing nothing, and a smaller step after a larger one reads its own rows' tables."""

import pytest
import torch

from gpu import cuda_graphs
from gpu.attention.metadata import AttentionMetadata
from gpu.batch import Batch, GroupTables
from gpu.cuda_graphs import DecodeGraphs, DecodeOutputs


class _NoEvent:
    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


@pytest.fixture
def unpinned_mirrors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host mirrors as plain CPU tensors (pinning and events need CUDA)."""

    def init(self: cuda_graphs.PinnedMirror, int64: torch.Tensor, int32: torch.Tensor) -> None:
        self.int64, self.int32 = torch.zeros_like(int64), torch.zeros_like(int32)
        self.copied = _NoEvent()
        self.written_tables = cuda_graphs.WrittenTables()

    monkeypatch.setattr(cuda_graphs.PinnedMirror, "__init__", init)


def decode_batch(tables: list[list[list[int]]], context_lens: list[int]) -> Batch:
    """One decode row per context: its token at the context's last position, a slot per group through its table."""
    def slots(group_tables: list[list[int]]) -> list[int]:
        return [table[(c - 1) // 16] * 16 + (c - 1) % 16 for table, c in zip(group_tables, context_lens, strict=True)]

    rows = len(context_lens)
    return Batch(token_ids=[1] * rows, positions=[c - 1 for c in context_lens], slot_mapping=slots(tables[0]),
                 query_lens=[1] * rows, context_lens=context_lens, block_tables=tables[0],
                 other_groups=[GroupTables(slots(t), t) for t in tables[1:]])


def test_each_group_reads_its_own_slots_and_tables(unpinned_mirrors: None) -> None:
    seen: list[AttentionMetadata] = []

    def forward(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        seen.append(meta)
        return torch.zeros(input_ids.shape[0], 4)

    graphs = DecodeGraphs(forward, max_num_seqs=8, max_model_len=64, block_size=16, device=torch.device("cpu"),
                          num_groups=2)
    null = 9  # the windowed group's null block: entries before the window
    steps = [
        ([[[0, 1, 2], [3, 4], [5]], [[null, 7, 8], [2, 3], [4]]], [40, 20, 3]),
        ([[[0, 1, 2, 6]], [[null, null, 8, 1]]], [49]),  # fewer rows after more
    ]
    for tables, context_lens in steps:
        batch = decode_batch(tables, context_lens)
        out = graphs.run(batch, last_sampled_ids=None)
        assert isinstance(out, DecodeOutputs) and out.hidden.shape[0] == batch.num_rows
        meta, bucket = seen[-1], graphs.bucket_for(batch.num_rows)
        groups = [(batch.slot_mapping, batch.block_tables),
                  *((g.slot_mapping, g.block_tables) for g in batch.other_groups)]
        for group, (slots, group_tables) in enumerate(groups):
            view = meta.of_group(group)
            assert view.slot_mapping.tolist() == slots + [-1] * (bucket - batch.num_rows)  # padding writes nothing
            assert view.block_tables.shape == (bucket, 4)
            for row, table in enumerate(group_tables):
                assert view.block_tables[row, : len(table)].tolist() == table
            assert view.context_lens is meta.context_lens
        assert meta.context_lens[: batch.num_rows].tolist() == context_lens
