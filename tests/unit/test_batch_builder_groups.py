"""The batch of a model with several KV-cache groups: every group's slots and block tables, from the block manager's
tables of each row, on prefill chunks and decodes (core/batch_builder.py)."""

from core.batch_builder import build_batch
from core.block_manager import BlockManager
from core.config import SchedulerConfig
from core.scheduler import Scheduler
from gpu.kv_cache_groups import KVCacheGroup
from tests.unit.scheduling_helpers import StepClock, complete_step, make_scheduler, make_seq

BLOCK = 4
WINDOW = 6


def test_each_group_writes_its_own_slots_and_reads_its_own_tables() -> None:
    # A small windowed pool reuses the blocks it freed, so its ids part from the full-attention group's.
    groups = [KVCacheGroup(None, 64), KVCacheGroup(WINDOW, 10)]
    scheduler = Scheduler(SchedulerConfig(4, 10), BlockManager(groups, BLOCK), StepClock())
    null_block = scheduler.block_manager.pools[1].null_block
    scheduler.add(make_seq("long", 23, max_tokens=12))
    scheduler.add(make_seq("short", 3, max_tokens=12, first_token=100))
    num_decodes = num_freed = num_tables_apart = 0
    for step in range(100):
        if step == 6:  # a prompt chunked on windowed blocks that others freed
            scheduler.add(make_seq("late", 19, max_tokens=4, first_token=200))
        out = scheduler.schedule()
        if not out.scheduled:
            break
        batch = build_batch(out.scheduled, BLOCK, eos_token_ids=())
        (group,) = batch.other_groups
        assert len(group.slot_mapping) == len(batch.slot_mapping) == len(batch.positions)
        token = 0
        for row, s in enumerate(out.scheduled):
            full, windowed = s.seq.block_tables
            assert batch.block_tables[row] is full and group.block_tables[row] is windowed
            num_freed += windowed.count(null_block)
            num_decodes += s.num_new_tokens == 1
            num_tables_apart += s.num_new_tokens > 1 and full[s.start // BLOCK] != windowed[s.start // BLOCK]
            for position in range(s.start, s.end):
                block = position // BLOCK
                assert windowed[block] != null_block, "a new token's block in the window is held"
                assert batch.slot_mapping[token] == full[block] * BLOCK + position % BLOCK
                assert group.slot_mapping[token] == windowed[block] * BLOCK + position % BLOCK
                token += 1
        complete_step(scheduler, out)
    assert num_decodes > 0 and num_freed > 0, "decodes ran and the windowed group freed blocks before its window"
    assert num_tables_apart > 0, "the groups gave a chunk other blocks (a slot read through the wrong table shows)"
    assert not scheduler.has_unfinished()


def test_a_one_group_model_has_no_other_groups() -> None:
    scheduler = make_scheduler(16, BLOCK, max_num_seqs=2, max_tokens_per_step=16)
    scheduler.add(make_seq("a", 9))
    out = scheduler.schedule()
    assert build_batch(out.scheduled, BLOCK, eos_token_ids=()).other_groups == []
