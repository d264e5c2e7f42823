"""Random histories of add / step / abort against Scheduler + BlockManager; invariants after every step, per KV-cache
group, for a full-attention model and for models with sliding-window groups (with and without a full one)."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from core.block_manager import BlockPool
from core.scheduler import Scheduler
from core.sequence import Sequence, SequenceStatus
from gpu.kv_cache_groups import KVCacheGroup, context_block_limit
from tests.unit.scheduling_helpers import StepClock, complete_step, make_scheduler, make_seq

actions = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 12), st.integers(0, 3)),
        st.tuples(st.just("step"), st.integers(0, 5)),
        st.tuples(st.just("abort"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=60,
)


def check_invariants(sched: Scheduler, live: list[Sequence]) -> None:
    bm = sched.block_manager
    for group, pool in enumerate(bm.pools):
        check_pool(pool, [seq.block_tables[group] for seq in sched.running])
    assert len(sched.running) <= sched.config.max_num_seqs
    for seq in sched.waiting:
        assert seq.status is SequenceStatus.WAITING and seq.block_tables == [] and seq.num_computed_tokens == 0
    for seq in sched.running:
        assert len(seq.block_tables) == len(bm.pools)
        assert seq.num_computed_tokens <= len(seq.block_tables[0]) * bm.block_size
        assert len(seq.block_keys) * bm.block_size <= seq.num_tokens
        for pool, table in zip(bm.pools, seq.block_tables, strict=True):
            check_table(pool, table, sched.config.max_num_batched_tokens)
    assert {id(s) for s in live} == {id(s) for s in list(sched.waiting) + sched.running}


def check_pool(pool: BlockPool, tables: list[list[int]]) -> None:
    holders = Counter(b for table in tables for b in table if b != pool.null_block)
    assert all(pool.ref_counts[b] == holders.get(b, 0) for b in range(pool.num_blocks))
    in_use = {b for b in range(pool.num_blocks) if pool.ref_counts[b] > 0}
    free, evictable = set(pool.free_ids), set(pool.evictable_ids)
    assert len(free) == len(pool.free_ids) and not (free & evictable) and not (in_use & (free | evictable))
    assert len(in_use) + len(free) + len(evictable) == pool.num_blocks
    assert all(pool.block_keys[b] is not None for b in evictable)
    assert all(pool.block_keys[b] is None for b in free)
    assert all(pool.block_keys[b] == key and pool.block_token_ids[b] is not None
               for key, b in pool.key_to_block.items())


def check_table(pool: BlockPool, table: list[int], max_num_batched_tokens: int) -> None:
    """A windowed table: its null entries a prefix, its blocks a window and a chunk at most."""
    num_null = table.count(pool.null_block) if pool.null_block is not None else 0
    assert all(b == pool.null_block for b in table[:num_null])
    if pool.sliding_window is not None:
        span = max(pool.sliding_window - 2, 0) + max_num_batched_tokens
        assert len(table) - num_null <= span // pool.block_size + 2


# The KV-cache groups' windows (None: full attention): one full group; windows beside it; windows only.
GROUPS = [(None,), (None, 3), (None, 5, 8), (4,)]


@settings(max_examples=150, deadline=None)
@given(actions, st.integers(4, 24), st.sampled_from([2, 4]), st.integers(1, 4), st.booleans(),
       st.sampled_from([0, 3]), st.sampled_from(GROUPS))
def test_invariants_hold_over_random_histories(
    history: list[tuple], num_blocks: int, block_size: int, max_num_seqs: int, same_prefix: bool,
    decode_hold_ms: int, windows: tuple[int | None, ...],
) -> None:
    budget = max_num_seqs * 4
    clock = StepClock()  # a step takes 1 ms: a hold of 3 ms runs out after 3 held steps
    sched = make_scheduler(num_blocks, block_size, max_num_seqs, budget, decode_hold_ms, clock, windows)
    sched.block_manager.enable_prefix_caching = True
    live: list[Sequence] = []
    for index, action in enumerate(history):
        if action[0] == "add":
            _, prompt_len, max_tokens, prefix_group = action
            groups = [KVCacheGroup(window, num_blocks) for window in windows]
            if -(-(prompt_len + max_tokens) // block_size) > context_block_limit(groups, block_size, 64, budget):
                continue  # the engine refuses what can never fit
            seq = make_seq(str(index), prompt_len, max_tokens, first_token=0 if same_prefix else prefix_group * 100)
            sched.add(seq)
            live.append(seq)
        elif action[0] == "abort" and live:
            seq = live.pop(action[1] % len(live))
            sched.finish(seq)
        elif action[0] == "step":
            clock.now += 0.001
            out = sched.schedule()
            assert out.num_batched_tokens <= budget
            for finished in complete_step(sched, out, next_token=action[1]):
                live.remove(finished)
        check_invariants(sched, live)
    while live:  # everything left runs to completion: no livelock, no lost sequence
        clock.now += 0.001
        out = sched.schedule()
        assert out.scheduled, "live sequences but nothing scheduled"
        for finished in complete_step(sched, out):
            live.remove(finished)
        check_invariants(sched, live)
    for pool in sched.block_manager.pools:
        assert all(c == 0 for c in pool.ref_counts)
        assert len(pool.free_ids) + len(pool.evictable_ids) == pool.num_blocks
