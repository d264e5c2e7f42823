"""The periodic stats line, as vLLM prints it: throughput, running/waiting requests, KV-cache usage,
the prefix-cache hit rate and, with speculative decoding, its acceptance, every `interval_s` seconds.

It is logged at INFO while the engine works (or did in the interval before), at DEBUG when idle, so
an idle server's log stays quiet. Figures come from the engine's cumulative counters (EngineStats):
throughputs and the hit rate are over the last interval.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from core.engine_stats import EngineStats

logger = logging.getLogger("openai_serve.stats")


def stats_line(before: EngineStats, after: EngineStats, seconds: float) -> str:
    if after.num_generation_tokens < before.num_generation_tokens:  # a restarted engine counts from 0 again
        before = _zero_counts(before)
    prompt_throughput = (after.num_prompt_tokens - before.num_prompt_tokens) / seconds
    generation_throughput = (after.num_generation_tokens - before.num_generation_tokens) / seconds
    queries = after.num_prefix_cache_queried_tokens - before.num_prefix_cache_queried_tokens
    hits = after.num_prefix_cache_hit_tokens - before.num_prefix_cache_hit_tokens
    hit_rate = hits / queries if queries else 0.0
    return (f"Avg prompt throughput: {prompt_throughput:.1f} tokens/s, "
            f"Avg generation throughput: {generation_throughput:.1f} tokens/s, "
            f"Running: {after.num_running} reqs, Waiting: {after.num_waiting} reqs, "
            f"KV cache usage: {after.kv_cache_usage * 100:.1f}%, Prefix cache hit rate: {hit_rate * 100:.1f}%"
            + _speculation_part(before, after))


def _speculation_part(before: EngineStats, after: EngineStats) -> str:
    """With speculative decoding, vLLM's figures over the interval: mean acceptance length (1 + accepted per
    draft), the share of draft tokens accepted, and per position."""
    if not after.num_spec_accepted_per_position:
        return ""
    drafts = after.num_spec_drafts - before.num_spec_drafts
    if drafts <= 0:
        return ", Spec decoding: no drafts"
    accepted = after.num_spec_accepted_tokens - before.num_spec_accepted_tokens
    draft_tokens = after.num_spec_draft_tokens - before.num_spec_draft_tokens
    earlier = before.num_spec_accepted_per_position or (0,) * len(after.num_spec_accepted_per_position)
    per_position = ", ".join(f"{(a - b) / drafts:.2f}"
                             for a, b in zip(after.num_spec_accepted_per_position, earlier, strict=True))
    return (f", Spec decoding: mean acceptance length {1 + accepted / drafts:.2f}, "
            f"draft acceptance rate {accepted / draft_tokens * 100:.1f}%, per position {per_position}")


def _zero_counts(stats: EngineStats) -> EngineStats:
    return replace(stats, num_prompt_tokens=0, num_generation_tokens=0, num_prefix_cache_queried_tokens=0,
                   num_prefix_cache_hit_tokens=0, num_spec_drafts=0, num_spec_draft_tokens=0,
                   num_spec_accepted_tokens=0, num_spec_accepted_per_position=())


def is_busy(before: EngineStats, after: EngineStats) -> bool:
    """Whether the engine did or holds any work between the two readings."""
    return (after.num_generation_tokens != before.num_generation_tokens
            or after.num_prompt_tokens != before.num_prompt_tokens
            or bool(after.num_running or after.num_waiting))


async def log_stats(engine_stats: Callable[[], EngineStats], interval_s: float) -> None:
    """Runs until cancelled (the app's lifespan does it). `engine_stats`: the serving engine's, now."""
    before, since = engine_stats(), time.monotonic()
    was_busy = False
    while True:
        await asyncio.sleep(interval_s)
        after, now = engine_stats(), time.monotonic()
        busy = is_busy(before, after)
        level = logging.INFO if busy or was_busy else logging.DEBUG  # and once more after it ended, as vLLM
        if logger.isEnabledFor(level):
            logger.log(level, "%s", stats_line(before, after, now - since))
        before, since, was_busy = after, now, busy
