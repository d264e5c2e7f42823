"""WrittenTables (gpu/host_to_device.py): a host buffer's block-table rows are rewritten only where a row's table
epoch differs from the one the buffer holds there, and the buffer always ends as a full write would leave it."""

import random

import numpy as np

from core.batch_builder import build_batch
from core.block_manager import BlockManager
from core.config import SchedulerConfig
from core.sampling_params import SamplingParams
from core.scheduler import Scheduler
from core.sequence import Sequence
from gpu.host_to_device import WrittenTables, pack_block_tables, write_block_tables
from gpu.kv_cache_groups import KVCacheGroup

POISON = -9
BLOCK_SIZE = 16


def full_write(group_tables: list[list[list[int]]], shape: tuple[int, int, int]) -> np.ndarray:
    out = np.full(shape, POISON, dtype=np.int32)
    for group, rows in enumerate(group_tables):
        write_block_tables(out[group, : len(rows)], rows)
    return out


def assert_rows_equal(tables: np.ndarray, group_tables: list[list[list[int]]]) -> None:
    for group, rows in enumerate(group_tables):
        for row, table in enumerate(rows):
            assert tables[group, row, : len(table)].tolist() == table


def test_only_rows_whose_epoch_changed_are_rewritten() -> None:
    shape = (2, 4, 6)
    tables, written = np.full(shape, POISON, dtype=np.int32), WrittenTables()
    first, windowed = [[1, 2], [3], [4, 5, 6]], [[10], [11, 12], [13]]
    written.write(tables, [first, windowed], [5, 6, 7], layout="decode")
    assert np.array_equal(tables, full_write([first, windowed], shape))
    tables[:, 0] = POISON  # row 0's table is unchanged at the next step: the poison shows it was not rewritten
    first[1].append(8)
    windowed[1][0] = 99  # a windowed release changes an entry in place: the epoch says so, not the length
    written.write(tables, [first, windowed], [5, 8, 7], layout="decode")
    assert (tables[:, 0] == POISON).all()
    assert tables[0, 1, :2].tolist() == [3, 8] and tables[1, 1, :2].tolist() == [99, 12]


def test_a_row_moved_another_layout_or_unknown_epochs_rewrite() -> None:
    shape = (1, 3, 4)
    tables, written = np.full(shape, POISON, dtype=np.int32), WrittenTables()
    rows = [[1, 2], [3, 4, 5], [6]]
    written.write(tables, [rows], [1, 2, 3], layout="a")
    written.write(tables, [rows[1:]], [2, 3], layout="a")  # row 0 finished: the others move up a row
    assert_rows_equal(tables, [rows[1:]])
    tables[:] = POISON
    written.write(tables, [rows[1:]], [2, 3], layout="b")  # the region moved: nothing it held is trusted
    assert_rows_equal(tables, [rows[1:]])
    tables[:] = POISON
    written.write(tables, [rows], [], layout="b")  # epochs not known: every row, and forgotten
    assert_rows_equal(tables, [rows])
    tables[:] = POISON
    written.write(tables, [rows], [1, 2, 3], layout="b")
    assert_rows_equal(tables, [rows])
    packed = pack_block_tables(rows)
    tables[:] = POISON
    written.write(tables, [packed], [1, 2, 3], layout="b")  # packed tables (tensor parallelism): written whole
    assert_rows_equal(tables, [rows])


def test_each_step_reads_back_its_tables_through_a_scheduled_run() -> None:
    """A scheduler over a small cache with a windowed group (admissions, prompt chunks, decodes, windowed releases,
    preemptions, finishes that move rows up), two buffers filled in turn as the runner's mirrors are, each step in
    the decode graphs' fixed layout or a mixed step's (whose region moves with its row capacity: garbage there
    after a move): every row of every step reads back its tables."""
    rng = random.Random(0)
    bm = BlockManager([KVCacheGroup(None, 24), KVCacheGroup(32, 24)], BLOCK_SIZE)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64), bm)
    buffers = [np.full((2, 8, 12), POISON, dtype=np.int32) for _ in range(2)]
    written, layouts = [WrittenTables(), WrittenTables()], [None, None]
    num_preemptions = num_skipped = 0
    for step in range(600):
        if rng.random() < 0.3 and len(scheduler.waiting) < 4:
            prompt = [rng.randrange(100) for _ in range(rng.randint(1, 60))]
            scheduler.add(Sequence(f"r{step}", prompt, SamplingParams(), max_tokens=rng.randint(1, 120)))
        out = scheduler.schedule()
        num_preemptions += len(out.preempted)
        if not out.scheduled:
            continue
        batch = build_batch(out.scheduled, BLOCK_SIZE, ())
        turn = step % 2
        layout = "decode" if batch.is_decode_only else ("mixed", rng.choice([6, 8]))
        if layout != layouts[turn]:
            buffers[turn][:] = np.random.default_rng(step).integers(-50, 50, buffers[turn].shape)
            layouts[turn] = layout
        group_tables = [batch.block_tables, *(g.block_tables for g in batch.other_groups)]
        before = buffers[turn].copy()
        written[turn].write(buffers[turn], group_tables, batch.table_epochs, layout)
        num_skipped += sum(np.array_equal(before[:, row], buffers[turn][:, row]) for row in range(batch.num_rows))
        for group, rows in enumerate(group_tables):
            for row, table in enumerate(rows):
                assert buffers[turn][group, row, : len(table)].tolist() == table, (step, group, row)
        for s in out.scheduled:
            seq = s.seq
            seq.num_computed_tokens = s.start + s.num_new_tokens
            if seq.num_computed_tokens == seq.num_tokens:  # the step samples its next token
                seq.add_pending_token(0, is_last=False)
                seq.resolve_pending_token(rng.randrange(100))
                if seq.num_output_tokens >= seq.max_tokens:
                    scheduler.finish(seq)
    assert num_preemptions > 0 and num_skipped > 0, (num_preemptions, num_skipped)  # both happened
