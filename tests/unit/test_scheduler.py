"""Scheduler: token budget, decode-first order, chunked prefill, prefix hits, preemption, limits."""

from core.sequence import SequenceStatus
from tests.unit.scheduling_helpers import StepClock, complete_step, make_scheduler, make_seq, scheduled_tokens


def test_waiting_sequences_are_admitted_within_the_token_budget() -> None:
    sched = make_scheduler(num_blocks=32, block_size=4, max_num_seqs=8, max_tokens_per_step=16)
    for name, first_token in (("a", 0), ("b", 100), ("c", 200)):
        sched.add(make_seq(name, 6, first_token=first_token))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 6, "b": 6, "c": 4}  # c gets the 4 tokens left: a chunk
    assert [s.request_id for s in sched.running] == ["a", "b", "c"]
    assert sched.running[2].block_tables[0] == [4]


def test_same_prompt_in_one_step_hits_blocks_computed_in_that_step() -> None:
    # Each layer writes the whole batch's K/V before attending, so a block filled by one row can
    # serve a prefix hit of a row later in the same step.
    sched = make_scheduler(num_blocks=32, block_size=4, max_num_seqs=8, max_tokens_per_step=16)
    sched.add(make_seq("a", 6))
    sched.add(make_seq("b", 6))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 6, "b": 2}
    assert sched.running[1].block_tables[0] == [0, 2]


def test_long_prompt_is_prefilled_in_chunks_while_others_decode() -> None:
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_tokens_per_step=8)
    sched.add(make_seq("short", 3))
    complete_step(sched, sched.schedule())  # short prefilled, sampled its first token
    sched.add(make_seq("long", 20))
    steps = []
    while any(s.request_id == "long" and s.num_output_tokens == 0 for s in sched.running + list(sched.waiting)):
        out = sched.schedule()
        steps.append(scheduled_tokens(out))
        complete_step(sched, out)
    assert steps == [{"short": 1, "long": 7}, {"short": 1, "long": 7}, {"short": 1, "long": 6}]


def test_decodes_go_before_unfinished_prefills() -> None:
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_tokens_per_step=8)
    sched.add(make_seq("long", 30))
    complete_step(sched, sched.schedule())  # long: 8 of 30 computed
    sched.add(make_seq("short", 2))
    complete_step(sched, sched.schedule())  # long 8 more; nothing left for short
    out = sched.schedule()
    assert scheduled_tokens(out) == {"long": 8}
    complete_step(sched, out)
    out = sched.schedule()
    assert scheduled_tokens(out) == {"long": 6, "short": 2}
    complete_step(sched, out)
    out = sched.schedule()
    assert list(scheduled_tokens(out)) == ["long", "short"]  # both decode now
    assert scheduled_tokens(out) == {"long": 1, "short": 1}


def test_prefix_hit_skips_cached_tokens() -> None:
    sched = make_scheduler(num_blocks=32, block_size=4, max_num_seqs=8, max_tokens_per_step=64)
    first = make_seq("a", 10, max_tokens=1)
    sched.add(first)
    complete_step(sched, sched.schedule())
    assert first.is_finished
    sched.add(make_seq("b", 10))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"b": 2}  # blocks 0 and 1 hit, tokens 8 and 9 computed
    assert out.scheduled[0].start == 8
    assert sched.running[0].num_cached_prompt_tokens == 8
    assert sched.num_prefix_hit_tokens == 8


def test_preemption_takes_the_newest_and_requeues_it_first() -> None:
    # 6 blocks of 4: a and b each hold 3 blocks after their 8-token prompts + 1 token.
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=8, max_tokens_per_step=64)
    a, b = make_seq("a", 8, max_tokens=8), make_seq("b", 8, max_tokens=8, first_token=100)
    sched.add(a)
    sched.add(b)
    complete_step(sched, sched.schedule())  # both prefilled: 2 blocks each, 1 token sampled
    complete_step(sched, sched.schedule())  # position 8 computed: third block each, all 6 used
    for _ in range(3):
        complete_step(sched, sched.schedule())  # positions 9..11 fit in the third blocks
    out = sched.schedule()  # position 12 needs a fourth block: b is preempted for a
    assert [s.request_id for s in out.preempted] == ["b"]
    assert scheduled_tokens(out) == {"a": 1}
    assert b.status is SequenceStatus.WAITING and b.block_tables == [] and b.num_computed_tokens == 0
    assert list(sched.waiting) == [b] and sched.num_preemptions == 1
    assert sched.block_manager.pools[0].ref_counts.count(0) == 2  # b's 3 blocks freed, a took one


def test_preempted_sequence_recomputes_prompt_and_output() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=8, max_tokens_per_step=64)
    a, b = make_seq("a", 8, max_tokens=6), make_seq("b", 8, max_tokens=8, first_token=100)
    sched.add(a)
    sched.add(b)
    while b.status is not SequenceStatus.WAITING or b.num_output_tokens == 0:
        complete_step(sched, sched.schedule())
    num_known = b.num_tokens
    while not a.is_finished:
        complete_step(sched, sched.schedule())
    out = sched.schedule()
    (readmitted,) = out.scheduled
    assert readmitted.seq is b
    assert readmitted.end == num_known  # prompt and generated tokens, minus prefix hits
    assert readmitted.start == b.num_cached_prompt_tokens or readmitted.start % 4 == 0


def test_max_num_seqs_caps_running_sequences() -> None:
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=2, max_tokens_per_step=64)
    for name in "abc":
        sched.add(make_seq(name, 3))
    out = sched.schedule()
    assert list(scheduled_tokens(out)) == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_admission_stops_when_blocks_run_out() -> None:
    sched = make_scheduler(num_blocks=3, block_size=4, max_num_seqs=8, max_tokens_per_step=64)
    sched.add(make_seq("a", 8))
    sched.add(make_seq("b", 8, first_token=50))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 8}
    assert [s.request_id for s in sched.waiting] == ["b"]


def test_finish_frees_blocks_from_any_state() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=8, max_tokens_per_step=64)
    a, b = make_seq("a", 5), make_seq("b", 5, first_token=9)
    sched.add(a)
    complete_step(sched, sched.schedule())
    sched.add(b)
    sched.finish(a)  # running
    sched.finish(b)  # waiting
    assert not sched.has_unfinished()
    assert sched.block_manager.num_used_blocks == 0


def test_a_decode_hold_spends_steps_on_prompts_until_it_runs_out() -> None:
    clock = StepClock()
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_tokens_per_step=8,
                           decode_hold_ms=30, clock=clock)
    sched.add(make_seq("a", 3))
    complete_step(sched, sched.schedule())  # a prefilled, sampled its first token: it decodes now
    sched.add(make_seq("long", 30, first_token=100))
    steps = []
    for _ in range(5):
        out = sched.schedule()
        steps.append(scheduled_tokens(out))
        complete_step(sched, out)
        clock.now += 0.012
    # held at 0, 12 and 24 ms; at 36 ms the hold has run out: one step for everyone (the last of the prompt)
    assert steps == [{"long": 8}, {"long": 8}, {"long": 8}, {"a": 1, "long": 6}, {"a": 1, "long": 1}]


def test_a_decode_hold_ends_with_the_prompts() -> None:
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_tokens_per_step=8, decode_hold_ms=1000)
    sched.add(make_seq("a", 3))
    complete_step(sched, sched.schedule())
    sched.add(make_seq("b", 5, first_token=100))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"b": 5}  # the clock never moves: only prompts can end the hold
    complete_step(sched, out)
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 1, "b": 1}


def test_a_decode_hold_never_leaves_a_step_empty() -> None:
    # c waits for a free slot (max_num_seqs 2): holding a and b would schedule nothing, so they decode
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=2, max_tokens_per_step=8, decode_hold_ms=1000)
    sched.add(make_seq("a", 3))
    sched.add(make_seq("b", 3, first_token=100))
    complete_step(sched, sched.schedule())
    sched.add(make_seq("c", 3, first_token=200))
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 1, "b": 1}
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_a_prompt_preempted_during_a_decode_hold_leaves_the_step_to_the_decodes() -> None:
    # 9 blocks of 2: a's 13-token prompt and b's first 3 tokens fill them all
    sched = make_scheduler(num_blocks=9, block_size=2, max_num_seqs=2, max_tokens_per_step=8, decode_hold_ms=3)
    a, b = make_seq("a", 13, max_tokens=2), make_seq("b", 5, max_tokens=1, first_token=100)
    sched.add(a)
    sched.add(b)
    complete_step(sched, sched.schedule())  # a: 8 tokens
    out = sched.schedule()
    assert scheduled_tokens(out) == {"a": 5, "b": 3}  # a samples its first token: it decodes now
    complete_step(sched, out)
    out = sched.schedule()  # b needs a block that a holds: held alone, b is preempted; a decodes
    assert scheduled_tokens(out) == {"a": 1}
    assert out.preempted == [b] and list(sched.waiting) == [b]
