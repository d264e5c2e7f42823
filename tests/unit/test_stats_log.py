"""The periodic stats line's figures, against hand-worked numbers: throughputs and the prefix-cache
hit rate are over the interval between two readings, the rest as of the second."""

from dataclasses import replace

from core.engine import EngineStats
from openai_serve.stats_log import is_busy, stats_line

IDLE = EngineStats(num_running=0, num_waiting=0, num_total_blocks=100, num_free_blocks=100, num_evictable_blocks=0,
                   num_used_blocks=0, num_preemptions=0, num_prefix_cache_hit_tokens=1000,
                   num_prefix_cache_queried_tokens=4000, num_prompt_tokens=5000, num_generation_tokens=7000)


def test_figures_are_over_the_interval() -> None:
    after = replace(IDLE, num_running=3, num_waiting=2, num_used_blocks=25, num_free_blocks=75,
                    num_prefix_cache_hit_tokens=1300, num_prefix_cache_queried_tokens=5000,
                    num_prompt_tokens=6000, num_generation_tokens=9000)
    assert stats_line(IDLE, after, 10.0) == (
        "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 200.0 tokens/s, "
        "Running: 3 reqs, Waiting: 2 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 30.0%")


def test_busy_means_work_done_or_held() -> None:
    assert not is_busy(IDLE, IDLE)
    assert is_busy(IDLE, replace(IDLE, num_generation_tokens=7001))
    assert is_busy(IDLE, replace(IDLE, num_waiting=1))
    assert "Prefix cache hit rate: 0.0%" in stats_line(IDLE, IDLE, 10.0)


def test_a_restarted_engine_counting_from_zero_gives_no_negative_throughput() -> None:
    restarted = replace(IDLE, num_prompt_tokens=100, num_generation_tokens=300, num_prefix_cache_hit_tokens=10,
                        num_prefix_cache_queried_tokens=40)
    assert stats_line(IDLE, restarted, 10.0).startswith(
        "Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 30.0 tokens/s")
    assert stats_line(IDLE, restarted, 10.0).endswith("Prefix cache hit rate: 25.0%")


def test_speculative_decoding_figures_are_over_the_interval() -> None:
    before = replace(IDLE, num_spec_drafts=10, num_spec_draft_tokens=40, num_spec_accepted_tokens=20,
                     num_spec_accepted_per_position=(9, 6, 3, 2))
    after = replace(before, num_spec_drafts=30, num_spec_draft_tokens=120, num_spec_accepted_tokens=50,
                    num_spec_accepted_per_position=(25, 15, 7, 3))
    assert stats_line(before, after, 10.0).endswith(", Spec decoding: mean acceptance length 2.50, draft acceptance "
                                                    "rate 37.5%, per position 0.80, 0.45, 0.20, 0.05")
    assert stats_line(after, after, 10.0).endswith(", Spec decoding: no drafts")
    assert "Spec" not in stats_line(IDLE, IDLE, 10.0)
    restarted = replace(after, num_generation_tokens=10, num_spec_drafts=2, num_spec_draft_tokens=8,
                        num_spec_accepted_tokens=4, num_spec_accepted_per_position=(2, 1, 1, 0))
    assert stats_line(after, restarted, 10.0).endswith("mean acceptance length 3.00, draft acceptance rate 50.0%, "
                                                       "per position 1.00, 0.50, 0.50, 0.00")
