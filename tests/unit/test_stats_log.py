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
