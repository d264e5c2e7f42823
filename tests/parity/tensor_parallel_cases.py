"""The cases a family's CPU tensor-parallel test runs on its checkpoint with a TP=1 and a TP=2 engine: TP=2 gives
exactly TP=1's float32 greedy tokens, which are transformers', through chunked prefill, preemption and prefix hits."""

from collections.abc import Iterator
from pathlib import Path

from core import LLM, SamplingParams
from tests.parity.test_parity_cpu import hf_greedy, prompts_of_lengths, record_schedules
from tests.parity.test_tensor_parallel_cpu import make_llm

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
Engines = tuple[Path, LLM, LLM]  # the checkpoint, its TP=1 engine, its TP=2 engine


def engines_of(model_dir: Path) -> Iterator[Engines]:
    """For a module fixture: one TP=2 engine per checkpoint serves every case, closed after them."""
    sharded = make_llm(model_dir, 2)
    yield model_dir, make_llm(model_dir, 1), sharded
    sharded.engine.close()


def check_a_batch_that_is_chunked_and_preempted(engines: Engines) -> None:
    model_dir, single, sharded = engines
    prompts = prompts_of_lengths((7, 12, 3, 18, 9, 14, 40))
    records = record_schedules(sharded.engine)
    tokens = [o.token_ids for o in sharded.generate(prompts, GREEDY)]
    assert sharded.engine.stats().num_preemptions > 0
    assert sum(s.end < s.seq.num_prompt_tokens for out in records for s in out.scheduled) >= 3, "chunked prefill"
    assert tokens == [o.token_ids for o in single.generate(prompts, GREEDY)]
    assert tokens == [hf_greedy(model_dir, p, MAX_NEW_TOKENS) for p in prompts]


def check_shared_prefixes_hit(engines: Engines) -> None:
    """Three prompts sharing 24 tokens, one after another: the second and third hit what the first cached."""
    model_dir, single, sharded = engines
    prompts = prompts_of_lengths((3, 6, 1), shared_prefix=24)
    before = sharded.engine.stats().num_prefix_cache_hit_tokens
    tokens = [o.token_ids for p in prompts for o in sharded.generate([p], GREEDY)]
    assert sharded.engine.stats().num_prefix_cache_hit_tokens - before >= 2 * 24
    assert tokens == [o.token_ids for o in single.generate(prompts, GREEDY)]
    assert tokens == [hf_greedy(model_dir, p, MAX_NEW_TOKENS) for p in prompts]
