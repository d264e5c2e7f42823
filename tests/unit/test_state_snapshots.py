"""The linear-attention state snapshots of hybrid models (core/state_snapshots.py) with the scheduler and the batch
builder, without a model: which rows a step restores and saves (and where inside its rows), when a save is keyed,
which snapshot is evicted, and that every row is free or keyed again at idle."""

from hypothesis import given, settings
from hypothesis import strategies as st

from core.batch_builder import build_batch
from core.block_manager import BlockManager
from core.config import SchedulerConfig
from core.penalty_slots import PenaltySlots
from core.scheduler import Scheduler, SchedulerOutput
from core.state_snapshots import LinearStates, StateSnapshots
from gpu.kv_cache_groups import KVCacheGroup
from tests.unit.scheduling_helpers import StepClock, complete_step, make_seq

BLOCK = 4
MAX_NUM_SEQS = 4


def make(num_snapshots: int = 4, max_tokens_per_step: int = 64) -> tuple[Scheduler, LinearStates]:
    snapshots = StateSnapshots(num_snapshots, MAX_NUM_SEQS, BLOCK)
    config = SchedulerConfig(MAX_NUM_SEQS, max_tokens_per_step)
    scheduler = Scheduler(config, BlockManager([KVCacheGroup(None, 64)], BLOCK), StepClock(), snapshots=snapshots)
    return scheduler, LinearStates(PenaltySlots(MAX_NUM_SEQS), snapshots)


def step(scheduler: Scheduler, states: LinearStates) -> tuple[SchedulerOutput, list[tuple[int, int]],
                                                               list[tuple[int, int]]]:
    """One step: (what ran, its restores, its saves); sequences that finish release their states."""
    out = scheduler.schedule()
    batch = build_batch(out.scheduled, BLOCK, (), PenaltySlots(MAX_NUM_SEQS), [], None, states)
    for seq in complete_step(scheduler, out):
        states.release(seq)
    return out, batch.state_restores, batch.state_saves


def run_to_end(scheduler: Scheduler, states: LinearStates) -> list[tuple[list[int], list, list]]:
    steps = []
    while scheduler.has_unfinished():
        out, restores, saves = step(scheduler, states)
        steps.append(([s.num_new_tokens for s in out.scheduled], restores, saves))
    return steps


def test_a_prompt_saves_at_its_last_boundary_inside_its_chunk() -> None:
    scheduler, states = make()
    seq = make_seq("a", 10, max_tokens=3)  # last boundary before its last token: 8
    scheduler.add(seq)
    out, restores, saves = step(scheduler, states)
    # The whole prompt in one step, its state saved after 8 tokens (row 0) into snapshot row 4, keyed at once.
    assert [s.num_new_tokens for s in out.scheduled] == [10] and restores == [] and saves == [(0, 8, 4)]
    assert states.snapshots is not None and list(states.snapshots.key_to_row.values()) == [4]


def test_a_later_prompt_restores_the_snapshot_and_saves_its_branch_point() -> None:
    scheduler, states = make()
    first = make_seq("a", 10, max_tokens=1)
    scheduler.add(first)
    run_to_end(scheduler, states)
    # Same first 8 tokens (a hit of 2 blocks with a snapshot at 8), then its own: saves at its last boundary 12.
    second = make_seq("b", 14, max_tokens=1)
    scheduler.add(second)
    out, restores, saves = step(scheduler, states)
    assert out.scheduled[0].start == 8 and out.scheduled[0].num_new_tokens == 6
    assert restores == [(4, 0)] and saves == [(0, 4, 5)]
    run_to_end(scheduler, states)
    # Shares 6 tokens with the second: the KV hit is 1 block, with no snapshot at 4: it computes from 0 and saves
    # at 4 (its branch point) and at 8, in one step.
    third = make_seq("c", 9, max_tokens=1)
    third.token_ids[6:] = [100, 101, 102]
    scheduler.add(third)
    steps = run_to_end(scheduler, states)
    assert steps[0] == ([9], [], [(0, 4, 6), (0, 8, 7)])
    assert states.snapshots is not None and states.snapshots.num_keyed == 4  # a's 8, b's 12, c's 4 and its own 8


def test_a_step_built_again_restores_again() -> None:
    """A step that failed to launch is rebuilt row by row (the engine's recovery): its restore comes again."""
    scheduler, states = make()
    scheduler.add(make_seq("a", 10, max_tokens=1))
    run_to_end(scheduler, states)
    scheduler.add(make_seq("b", 14, max_tokens=1))
    out = scheduler.schedule()
    first = build_batch(out.scheduled, BLOCK, (), PenaltySlots(MAX_NUM_SEQS), [], None, states)
    again = build_batch(out.scheduled, BLOCK, (), PenaltySlots(MAX_NUM_SEQS), [], None, states)
    assert first.state_restores == again.state_restores == [(4, 0)]


def test_decode_keeps_its_latest_boundary_only() -> None:
    scheduler, states = make()
    seq = make_seq("a", 3, max_tokens=11)  # decodes past positions 4, 8, 12
    scheduler.add(seq)
    steps = run_to_end(scheduler, states)
    saves = [save for _, _, step_saves in steps for save in step_saves]
    assert saves == [(0, 1, 4), (0, 1, 5), (0, 1, 6)]  # each at its decode row's end
    snapshots = states.snapshots  # rows 4 and 5 (boundaries 4 and 8) freed as the next was saved
    assert snapshots is not None and list(snapshots.key_to_row.values()) == [6]
    assert list(snapshots.free_rows) == [7, 4, 5]
    assert len(snapshots.free_rows) + snapshots.num_keyed == snapshots.num_snapshots


def test_the_least_recently_used_snapshot_is_evicted() -> None:
    scheduler, states = make(num_snapshots=2)
    for index, length in enumerate((6, 10, 14)):  # each saves at its last boundary: 4, 8, 12 (distinct tokens)
        scheduler.add(make_seq(str(index), length, max_tokens=1, first_token=100 * index))
        run_to_end(scheduler, states)
    snapshots = states.snapshots
    assert snapshots is not None and snapshots.num_keyed == 2 and len(snapshots.free_rows) == 0
    hit = make_seq("again", 7, max_tokens=1)  # the first prompt's tokens: its snapshot was evicted
    scheduler.add(hit)
    out, restores, _ = step(scheduler, states)
    assert out.scheduled[0].start == 0 and restores == []


def test_a_failed_sequence_leaves_no_snapshot_and_its_slot() -> None:
    scheduler, states = make()
    seq = make_seq("a", 10, max_tokens=3)
    scheduler.add(seq)
    step(scheduler, states)
    snapshots = states.snapshots
    assert snapshots is not None and snapshots.num_keyed == 1
    scheduler.finish(seq, keep_cached=False)  # its steps' states are not to be trusted
    states.release(seq)
    assert states.slots.num_free == MAX_NUM_SEQS and seq.state_slot is None
    assert seq.unkeyed_snapshots == [] and snapshots.num_keyed == 0 and len(snapshots.free_rows) == 4


def check_rows(states: LinearStates, live: list) -> None:
    """Every snapshot row is exactly one of: free, keyed, or held unkeyed by one live sequence."""
    snapshots = states.snapshots
    assert snapshots is not None
    held = [row for seq in live for _, row in seq.unkeyed_snapshots]
    rows = list(snapshots.free_rows) + list(snapshots.key_to_row.values()) + held
    assert sorted(rows) == list(range(MAX_NUM_SEQS, MAX_NUM_SEQS + snapshots.num_snapshots))
    slots = [seq.state_slot for seq in live if seq.state_slot is not None]
    assert len(slots) == len(set(slots)) and states.slots.num_free + len(slots) == MAX_NUM_SEQS


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 10), st.integers(0, 2)),
                          st.tuples(st.just("step")), st.tuples(st.just("abort"), st.integers(0, 50))),
                min_size=1, max_size=50),
       st.integers(8, 24), st.integers(1, 5))
def test_rows_are_accounted_for_over_random_histories(history: list[tuple], num_blocks: int,
                                                      num_snapshots: int) -> None:
    snapshots = StateSnapshots(num_snapshots, MAX_NUM_SEQS, BLOCK)
    block_manager = BlockManager([KVCacheGroup(None, num_blocks)], BLOCK)
    scheduler = Scheduler(SchedulerConfig(MAX_NUM_SEQS, 16), block_manager, StepClock(), snapshots=snapshots)
    states = LinearStates(PenaltySlots(MAX_NUM_SEQS), snapshots)
    live: list = []

    def run_step() -> None:
        out = scheduler.schedule()
        for seq in out.preempted:
            states.release(seq)
        batch = build_batch(out.scheduled, BLOCK, (), PenaltySlots(MAX_NUM_SEQS), [], None, states)
        for row, num_tokens, _ in batch.state_saves:  # inside its row, or at its end
            assert 0 < num_tokens <= batch.query_lens[row]
        for seq in complete_step(scheduler, out):
            states.release(seq)
            live.remove(seq)

    for index, action in enumerate(history):
        if action[0] == "add" and -(-(action[1] + action[2]) // BLOCK) <= num_blocks:
            seq = make_seq(str(index), action[1], action[2], first_token=100 * action[3])
            scheduler.add(seq)
            live.append(seq)
        elif action[0] == "abort" and live:
            seq = live.pop(action[1] % len(live))
            scheduler.finish(seq)
            states.release(seq)
        elif action[0] == "step":
            run_step()
        check_rows(states, live)
    while live:
        run_step()
        check_rows(states, live)
    assert len(snapshots.free_rows) + snapshots.num_keyed == num_snapshots
