"""Drives Scheduler + BlockManager without a model: what the engine's postprocess does to sequences."""

from core.block_manager import BlockManager
from core.config import SchedulerConfig
from core.sampling_params import SamplingParams
from core.scheduler import Scheduler, SchedulerOutput
from core.sequence import Sequence
from gpu.kv_cache_groups import KVCacheGroup


class StepClock:
    """A scheduler's clock that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(num_blocks: int, block_size: int, max_num_seqs: int, max_tokens_per_step: int,
                   decode_hold_ms: float = 0.0, clock: StepClock | None = None,
                   windows: tuple[int | None, ...] = (None,)) -> Scheduler:
    """`windows`: the KV-cache groups' (None: full attention), each with `num_blocks` blocks."""
    config = SchedulerConfig(max_num_seqs, max_tokens_per_step, decode_hold_ms=decode_hold_ms)
    groups = [KVCacheGroup(window, num_blocks) for window in windows]
    return Scheduler(config, BlockManager(groups, block_size), clock or StepClock())


def make_seq(request_id: str, num_prompt_tokens: int, max_tokens: int = 8, first_token: int = 0) -> Sequence:
    prompt = [first_token + i for i in range(num_prompt_tokens)]
    return Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens), max_tokens)


def complete_step(scheduler: Scheduler, out: SchedulerOutput, next_token: int = 7) -> list[Sequence]:
    """Marks scheduled tokens computed, appends a token where one is sampled, finishes at max_tokens.
    Returns the sequences that finished."""
    finished = []
    for s in out.scheduled:
        is_sampled = s.end == s.seq.num_tokens
        s.seq.num_computed_tokens = s.end
        if is_sampled:
            s.seq.add_pending_token(0, is_last=False)
            s.seq.resolve_pending_token(next_token)
            if s.seq.num_output_tokens >= s.seq.max_tokens:
                scheduler.finish(s.seq)
                finished.append(s.seq)
    return finished


def scheduled_tokens(out: SchedulerOutput) -> dict[str, int]:
    return {s.seq.request_id: s.num_new_tokens for s in out.scheduled}
