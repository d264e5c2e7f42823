"""The oracle: with the same weights, our greedy tokens equal transformers' greedy tokens (float32, CPU).

Every family runs every case (tests/tiny_specs.py): Llama, Qwen2, Qwen3, Mistral with and without a sliding
window, Phi-3 (fused projections, partial rotary, longrope, a window), Gemma 3 (text, and the language model of an
image-text checkpoint: windows, soft-caps) and Gemma 4 (per-layer inputs, shared KV, values as keys). Prompts run
past the windows (16-24 tokens) and past a KV block. Each case also checks that the engine really took the path
it is about (prefix hits, preemption, chunked prefill, requests joining a running batch), so a case cannot pass
by not exercising it; `test_windows_change_the_tokens` checks that the windows are exercised too.
"""

from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from core import LLM, SamplingParams
from core.engine import LLMEngine
from core.scheduler import SchedulerOutput
from gpu.attention.variant import PLAIN
from gpu.batch import Batch, GroupTables
from tests.tiny_specs import FAMILY_SPECS

MAX_NEW_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
PROMPT_LENGTHS = (1, 5, 17, 33, 64, 9)
MODELS = ("qwen3", "llama", "qwen2", *FAMILY_SPECS)
WINDOWED = [name for name, spec in FAMILY_SPECS.items() if dict(spec.overrides).get("sliding_window")]


def prompts_of_lengths(lengths: tuple[int, ...], vocab: int = 500, shared_prefix: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(sum(lengths) + shared_prefix)
    prefix = torch.randint(3, vocab, (shared_prefix,), generator=generator).tolist()
    return [prefix + torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


@cache
def hf_model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: Path, prompt: list[int], max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    model = hf_model(model_dir)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def make_llm(model_dir: Path, num_blocks: int = 256, block_size: int = 16, max_tokens_per_step: int = 512) -> LLM:
    return LLM(
        str(model_dir), dtype="float32",
        block_size=block_size, kv_cache_blocks=num_blocks, max_num_seqs=16, max_num_batched_tokens=max_tokens_per_step,
    )


def record_schedules(engine: LLMEngine) -> list[SchedulerOutput]:
    """Keeps every SchedulerOutput of the engine, to check which path a case exercised."""
    records: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording_schedule() -> SchedulerOutput:
        out = schedule()
        records.append(out)
        return out

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    return records


def whole_prompt_batch(prompt: list[int], engine: LLMEngine) -> Batch:
    """A prompt computed in one step on the first blocks of every KV-cache group (blocks of 16 tokens)."""
    n = len(prompt)
    tables = [list(range(-(-n // 16)))]
    groups = [GroupTables(list(range(n)), tables) for _ in engine.runner.kv_cache_groups[1:]]
    return Batch(token_ids=prompt, positions=list(range(n)), slot_mapping=list(range(n)), query_lens=[n],
                 context_lens=[n], block_tables=tables, sampling=[None], other_groups=groups)


def model_dir_of(tiny_model_dirs: dict[str, Path], model: str) -> Path:
    if model not in tiny_model_dirs:
        pytest.skip(f"this transformers has no {model} model class")
    return tiny_model_dirs[model]


def assert_matches_hf(model_dir: Path, prompts: list[list[int]], outputs: list) -> None:
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == hf_greedy(model_dir, prompt), f"prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("model", MODELS)
def test_batch_of_different_lengths(tiny_model_dirs: dict[str, Path], model: str) -> None:
    prompts = prompts_of_lengths(PROMPT_LENGTHS)
    outputs = make_llm(model_dir_of(tiny_model_dirs, model)).generate(prompts, GREEDY)
    assert_matches_hf(model_dir_of(tiny_model_dirs, model), prompts, outputs)


@pytest.mark.parametrize("model", MODELS)
def test_shared_prefixes_hit_the_prefix_cache(tiny_model_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(model_dir_of(tiny_model_dirs, model))
    prompts = prompts_of_lengths((3, 11, 20, 1), shared_prefix=48)
    first = llm.generate(prompts[:1], GREEDY)
    rest = llm.generate(prompts[1:], GREEDY)
    assert llm.engine.stats().num_prefix_cache_hit_tokens >= 3 * 48
    assert_matches_hf(model_dir_of(tiny_model_dirs, model), prompts, first + rest)


@pytest.mark.parametrize("model", MODELS)
def test_small_kv_cache_preempts_and_recomputes(tiny_model_dirs: dict[str, Path], model: str) -> None:
    # 12 blocks of 4 tokens for 6 sequences of up to ~30 tokens each: they cannot all stay resident.
    llm = make_llm(model_dir_of(tiny_model_dirs, model), num_blocks=12, block_size=4)
    prompts = prompts_of_lengths((7, 12, 3, 18, 9, 14))
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.stats().num_preemptions > 0
    assert_matches_hf(model_dir_of(tiny_model_dirs, model), prompts, outputs)
    assert llm.engine.stats().num_used_blocks == 0


@pytest.mark.parametrize("model", MODELS)
def test_small_token_budget_chunks_prompts(tiny_model_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(model_dir_of(tiny_model_dirs, model), max_tokens_per_step=16)
    records = record_schedules(llm.engine)
    prompts = prompts_of_lengths((50, 7, 40, 23))
    outputs = llm.generate(prompts, GREEDY)
    chunks = [s for out in records for s in out.scheduled if s.end < s.seq.num_prompt_tokens]
    assert len(chunks) >= 4, "long prompts were prefilled in several steps"
    assert_matches_hf(model_dir_of(tiny_model_dirs, model), prompts, outputs)


@pytest.mark.parametrize("model", MODELS)
def test_requests_added_while_others_run(tiny_model_dirs: dict[str, Path], model: str) -> None:
    engine = make_llm(model_dir_of(tiny_model_dirs, model), max_tokens_per_step=24).engine
    records = record_schedules(engine)
    prompts = prompts_of_lengths((30, 4, 19, 41, 2))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    engine.add_request("0", prompts[0], GREEDY)
    for index, prompt in enumerate(prompts[1:], start=1):
        for _ in range(3):
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        engine.add_request(str(index), prompt, GREEDY)
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    assert any(len({s.seq.request_id for s in out.scheduled}) >= 2 and any(s.start > 0 for s in out.scheduled)
               for out in records), "a new request joined a batch that was already decoding"
    for index, prompt in enumerate(prompts):
        assert tokens[str(index)] == hf_greedy(model_dir_of(tiny_model_dirs, model), prompt)


@pytest.mark.parametrize("model", WINDOWED)
def test_a_shared_prefix_hits_after_its_windowed_blocks_were_freed(tiny_model_dirs: dict[str, Path],
                                                                   model: str) -> None:
    """A long prompt prefilled in chunks: its windowed layers free the blocks before their window as it goes. A
    second request sharing its prefix hits it all (the full-attention blocks of the whole prefix, the windowed ones
    of its last window) and gives transformers' tokens."""
    model_dir = model_dir_of(tiny_model_dirs, model)
    llm = make_llm(model_dir, max_tokens_per_step=16)
    freed = record_freed_windowed_blocks(llm.engine)
    prompts = prompts_of_lengths((5, 9), shared_prefix=96)
    first = llm.generate(prompts[:1], GREEDY)
    assert freed, "the first request's windowed layers freed blocks before their window while it ran"
    hits_before = llm.engine.stats().num_prefix_cache_hit_tokens
    second = llm.generate(prompts[1:], GREEDY)
    assert llm.engine.stats().num_prefix_cache_hit_tokens - hits_before == 96
    assert_matches_hf(model_dir, prompts, first + second)


def record_freed_windowed_blocks(engine: LLMEngine) -> list[int]:
    """The number of null entries in a scheduled sequence's windowed tables, at each step that had some."""
    freed: list[int] = []
    schedule = engine.scheduler.schedule
    windowed = [g for g, pool in enumerate(engine.block_manager.pools) if pool.sliding_window is not None]

    def recording_schedule() -> SchedulerOutput:
        out = schedule()
        null_entries = sum(s.seq.block_tables[g].count(engine.block_manager.pools[g].null_block)
                           for s in out.scheduled for g in windowed)
        if null_entries:
            freed.append(null_entries)
        return out

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    return freed


@pytest.mark.parametrize("model", WINDOWED)
def test_windows_change_the_logits(tiny_model_dirs: dict[str, Path], model: str) -> None:
    """The same model with its windows taken off computes other logits for a prompt longer than the window (in one
    step, every block of the prompt in every group): the cases above exercise the windowed attention (and would catch
    a window not applied)."""
    model_dir = model_dir_of(tiny_model_dirs, model)
    engine = make_llm(model_dir).engine
    for layer in engine.runner.model.attention_layers():
        layer.variant = PLAIN
    prompt = prompts_of_lengths((40,))[0]
    ours = engine.runner.model.compute_logits(engine.runner._forward(whole_prompt_batch(prompt, engine)))
    with torch.no_grad():
        theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0]
    assert not torch.allclose(ours, theirs, rtol=1e-2, atol=1e-2)


def test_eos_stops_generation_like_transformers(tiny_qwen3_dir: Path) -> None:
    # Long generations on a random model: wherever transformers stops at EOS, so must we.
    prompts = prompts_of_lengths(tuple(range(1, 25)))
    params = SamplingParams(temperature=0.0, max_tokens=60)
    outputs = make_llm(tiny_qwen3_dir).generate(prompts, params)
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = hf_greedy(tiny_qwen3_dir, prompt, max_new_tokens=60)
        assert output.token_ids == expected
        assert output.finish_reason.value == ("stop" if len(expected) < 60 else "length")
    assert sum(o.finish_reason.value == "stop" for o in outputs) >= 2, "some generations end at EOS"


def test_sharded_checkpoint_loads_the_same_weights(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    source = tiny_model_dirs["llama"]
    sharded = tmp_path / "sharded"
    hf_model(source).save_pretrained(sharded, max_shard_size="100KB")
    for tokenizer_file in source.glob("tokenizer*"):
        (sharded / tokenizer_file.name).write_bytes(tokenizer_file.read_bytes())
    assert (sharded / "model.safetensors.index.json").exists()
    prompts = prompts_of_lengths((8, 21))
    assert_matches_hf(source, prompts, make_llm(sharded).generate(prompts, GREEDY))


def test_logits_close_to_transformers(tiny_model_dirs: dict[str, Path]) -> None:
    for model_dir in tiny_model_dirs.values():
        engine = make_llm(model_dir).engine
        prompt = prompts_of_lengths((40,))[0]
        hidden = engine.runner._forward(whole_prompt_batch(prompt, engine))
        ours = engine.runner.model.compute_logits(hidden)
        with torch.no_grad():
            theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
