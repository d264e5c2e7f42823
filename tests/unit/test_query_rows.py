"""A step's queries laid out as decode rows (AttentionMetadata.query_rows): each query's row, its context length
(position + 1) and its row's block table, made the host's way (gpu/model_runner.py's step_inputs) and the device's
(gpu/device_verification.py's lay_out), and which steps have them. The Triton backend's use of them:
tests/unit/verify_attention_interpreted_cases.py."""

import numpy as np
import torch

from gpu.attention.metadata import MAX_QUERIES_AS_ROWS, query_rows_of_host_rows, query_rows_of_uniform_rows
from gpu.batch import Batch, GroupTables
from gpu.device_verification import DeviceVerifyBatch, device_inputs, lay_out, step_shape
from gpu.model_runner import step_inputs
from gpu.token_history import HistoryFill, TokenHistory

CPU = torch.device("cpu")


def test_query_rows_from_the_host_and_the_device_agree() -> None:
    """Rows of k + 1 = 4 queries: the same rows, context lengths and tables either way."""
    context_lens = torch.tensor([4, 10, 6], dtype=torch.int32)
    table = torch.arange(9, dtype=torch.int32).view(3, 3)
    host = query_rows_of_host_rows(np.array([4, 4, 4]), context_lens.numpy(), table)
    device = query_rows_of_uniform_rows(context_lens[:, None].long() - 4 + torch.arange(4), table)
    assert host.context_lens.tolist() == [1, 2, 3, 4, 7, 8, 9, 10, 3, 4, 5, 6]
    assert host.rows.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert host.block_tables[5].tolist() == [3, 4, 5]
    for mine, theirs in zip((host.rows, host.context_lens, host.block_tables),
                            (device.rows, device.context_lens, device.block_tables), strict=True):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    assert host.queries_per_row == device.queries_per_row == 4  # one program a row's queries


def _batch(query_lens: list[int], context_lens: list[int], other_groups: list[GroupTables] | None = None) -> Batch:
    num_tokens = sum(query_lens)
    return Batch(token_ids=[0] * num_tokens, positions=[0] * num_tokens, slot_mapping=[-1] * num_tokens,
                 query_lens=query_lens, context_lens=context_lens, block_tables=[[3, 4], [5], [6, 7]],
                 other_groups=other_groups or [], num_draft_tokens=[n - 1 for n in query_lens])


def test_a_host_laid_verifying_step_has_them_in_every_group() -> None:
    """Rows of 3, 1 and 2 queries (a row with no drafts beside rows verifying some); group 1 reads its own tables."""
    group = GroupTables(slot_mapping=[-1] * 6, block_tables=[[9], [8, 1], [2]])
    _, _, meta = step_inputs(_batch([3, 1, 2], [7, 4, 6], [group]), CPU)
    assert meta.query_rows is not None
    assert meta.query_rows.rows.tolist() == [0, 0, 0, 1, 2, 2]
    assert meta.query_rows.context_lens.tolist() == [5, 6, 7, 4, 5, 6]
    assert meta.query_rows.block_tables.tolist() == [[3, 4]] * 3 + [[5, 0], [6, 7], [6, 7]]
    assert meta.query_rows.queries_per_row == 1  # rows of unlike counts: a program a query
    other = meta.of_group(1).query_rows
    assert other is not None and other.block_tables.tolist() == [[9, 0]] * 3 + [[8, 1], [2, 0], [2, 0]]


def test_steps_without_them() -> None:
    """A decode step (the decode kernel's own rows) and a step with a row of more than MAX_QUERIES_AS_ROWS."""
    assert step_inputs(_batch([1, 1, 1], [7, 4, 6]), CPU)[2].query_rows is None
    long = MAX_QUERIES_AS_ROWS + 1
    assert step_inputs(_batch([2, long, 1], [7, long + 3, 6]), CPU)[2].query_rows is None
    assert step_inputs(_batch([2, long - 1, 1], [7, long + 3, 6]), CPU)[2].query_rows is not None


def test_a_device_laid_verifying_step_has_them() -> None:
    """lay_out's rows of k + 1 queries: each query's context ends at its own position."""
    history = TokenHistory(num_slots=4, max_model_len=32, device=CPU)
    history.fill([HistoryFill(3, 0, [1, 2, 3, 1, 2]), HistoryFill(1, 0, [7, 8, 9])])
    batch = DeviceVerifyBatch(slots=[3, 1], block_tables=[[5, 6], [2]], sampling=[], num_drafts=3, min_n=1, max_n=2,
                              max_context_len=8)
    inputs = lay_out(history, device_inputs(batch, CPU), step_shape(batch, block_size=4))
    query_rows = inputs.meta.query_rows
    assert query_rows is not None
    assert query_rows.context_lens.tolist() == (inputs.positions + 1).tolist() == [5, 6, 7, 8, 3, 4, 5, 6]
    assert query_rows.block_tables.tolist() == [[5, 6]] * 4 + [[2, 0]] * 4
