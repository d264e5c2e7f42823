"""Random histories of add / step / abort against Scheduler + BlockManager; invariants after every step."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from core.scheduler import Scheduler
from core.sequence import Sequence, SequenceStatus
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
    holders = Counter(b for seq in sched.running for b in seq.block_ids)
    assert all(bm.ref_counts[b] == holders.get(b, 0) for b in range(bm.num_blocks))
    in_use = {b for b in range(bm.num_blocks) if bm.ref_counts[b] > 0}
    free, evictable = set(bm.free_ids), set(bm.evictable_ids)
    assert len(free) == len(bm.free_ids) and not (free & evictable) and not (in_use & (free | evictable))
    assert len(in_use) + len(free) + len(evictable) == bm.num_blocks
    assert all(bm.block_keys[b] is not None for b in evictable)
    assert all(bm.block_keys[b] is None for b in free)
    assert all(bm.block_keys[b] == key and bm.block_token_ids[b] is not None for key, b in bm.key_to_block.items())
    assert len(sched.running) <= sched.config.max_num_seqs
    for seq in sched.waiting:
        assert seq.status is SequenceStatus.WAITING and seq.block_ids == [] and seq.num_computed_tokens == 0
    for seq in sched.running:
        assert seq.num_computed_tokens <= len(seq.block_ids) * bm.block_size
        assert len(seq.block_keys) * bm.block_size <= seq.num_tokens
    assert {id(s) for s in live} == {id(s) for s in list(sched.waiting) + sched.running}


@settings(max_examples=150, deadline=None)
@given(actions, st.integers(4, 24), st.sampled_from([2, 4]), st.integers(1, 4), st.booleans(),
       st.sampled_from([0, 3]))
def test_invariants_hold_over_random_histories(
    history: list[tuple], num_blocks: int, block_size: int, max_num_seqs: int, same_prefix: bool,
    decode_hold_ms: int,
) -> None:
    budget = max_num_seqs * 4
    clock = StepClock()  # a step takes 1 ms: a hold of 3 ms runs out after 3 held steps
    sched = make_scheduler(num_blocks, block_size, max_num_seqs, budget, decode_hold_ms, clock)
    sched.block_manager.enable_prefix_caching = True
    live: list[Sequence] = []
    for index, action in enumerate(history):
        if action[0] == "add":
            _, prompt_len, max_tokens, prefix_group = action
            if -(-(prompt_len + max_tokens) // block_size) > num_blocks:
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
    bm = sched.block_manager
    assert all(c == 0 for c in bm.ref_counts)
    assert len(bm.free_ids) + len(bm.evictable_ids) == bm.num_blocks
