"""What the engine reports of itself: its own module, so the server's process reads it without importing the engine
(core/engine_process.py)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    """The block counts are summed over the KV-cache groups (gpu/kv_cache_groups.py)."""

    num_running: int
    num_waiting: int
    num_total_blocks: int
    num_free_blocks: int
    num_evictable_blocks: int
    num_used_blocks: int
    num_preemptions: int
    num_prefix_cache_hit_tokens: int
    num_prefix_cache_queried_tokens: int
    num_prompt_tokens: int  # of requests whose prefill finished
    num_generation_tokens: int
    # Speculative decoding (vLLM's spec_decode counters); accepted per draft position is empty when it is off.
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    num_spec_accepted_per_position: tuple[int, ...] = ()

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV-cache blocks in use (referenced by a request), from 0 to 1, over every group's."""
        return self.num_used_blocks / self.num_total_blocks if self.num_total_blocks else 0.0
