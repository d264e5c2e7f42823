"""Speculative decoding end to end on a tiny model: with n-gram drafts the output equals the output without
them (greedy, and seeded sampling token for token), whatever else the request asks for, and every block is
free at the end.

Each test runs the same requests on an engine without speculation and on one whose draft length is fixed
(`adaptive` false: every step that can verify drafts does), and checks that drafts were really accepted where
the prompts repeat (else the equality would prove nothing).
"""

import random
import re
import time
from pathlib import Path

import pytest

from core import LLM, FinishReason, SamplingParams
from core.engine import LLMEngine
from core.llm import GenerationOutput
from core.scheduler import ScheduledSequence, SchedulerOutput
from core.sequence import Sequence
from core.tiny_model import build_tiny_model, has_architecture
from gpu.batch import Batch
from tests.parity.test_parity_cpu import record_schedules
from tests.tiny_specs import FAMILY_SPECS, TINY_SPECS

COMMON = dict(max_model_len=256, block_size=8, max_num_seqs=8, max_num_batched_tokens=64, dtype="float32",
              device="cpu")
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [40, 41, 42, 40, 41, 42, 40, 41], [70, 71, 72, 73] * 6]
PLAIN = [list(range(100, 137)), [3, 99, 250, 17, 480, 61]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("spec") / "qwen3", TINY_SPECS["qwen3"])


@pytest.fixture(scope="module")
def plain_llm(model_dir: Path) -> LLM:
    return LLM(str(model_dir), kv_cache_blocks=128, **COMMON)


def speculating_llm(model_dir: Path, num_drafts: int | None = 4, method: str = "ngram", **settings: object) -> LLM:
    """`num_drafts`: the fixed draft length; None: the engine's own controller."""
    settings = {"kv_cache_blocks": 128, **COMMON, **settings}
    config = {"method": method, "num_speculative_tokens": num_drafts or 4, "adaptive": num_drafts is None}
    if method == "ngram":
        config["prompt_lookup_max"] = 3
    return LLM(str(model_dir), speculative_config=config, **settings)


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
             ) -> list[GenerationOutput]:
    outputs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats.num_used_blocks == 0
    assert stats.num_free_blocks + stats.num_evictable_blocks == stats.num_total_blocks
    return outputs


def tokens(outputs: list[GenerationOutput]) -> list[tuple[list[int], FinishReason | None]]:
    return [(o.token_ids, o.finish_reason) for o in outputs]


def accepted(llm: LLM) -> int:
    return llm.engine.speculation.counts.num_accepted_tokens  # type: ignore[union-attr]


def test_greedy_output_is_the_same_with_drafts_accepted(plain_llm: LLM, model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    llm = speculating_llm(model_dir)
    assert tokens(generate(llm, REPEATING + PLAIN, params)) == tokens(generate(plain_llm, REPEATING + PLAIN, params))
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_accepted_tokens > 10 and counts.num_draft_tokens > counts.num_accepted_tokens
    assert counts.accepted_per_position[0] >= counts.accepted_per_position[-1]


def test_greedy_output_is_the_same_without_repetition_and_with_the_measured_controller(
        plain_llm: LLM, model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24)
    for num_drafts in (4, None):
        llm = speculating_llm(model_dir, num_drafts)
        assert tokens(generate(llm, PLAIN, params)) == tokens(generate(plain_llm, PLAIN, params))


def test_seeded_sampling_draws_the_same_tokens(plain_llm: LLM, model_dir: Path) -> None:
    """A seeded row draws output token i with the noise of (seed, i) whether or not it is a verified position."""
    params = [SamplingParams(temperature=t, seed=seed, max_tokens=40, ignore_eos=True)
              for t, seed in [(0.05, 1), (0.05, 2), (0.3, 3), (1.0, 4), (0.05, 5)]]
    prompts = REPEATING + PLAIN
    llm = speculating_llm(model_dir)
    assert tokens(generate(llm, prompts, params)) == tokens(generate(plain_llm, prompts, params))
    assert accepted(llm) > 5


def test_logprobs_of_verified_positions(plain_llm: LLM, model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=30, logprobs=3, ignore_eos=True)
    llm = speculating_llm(model_dir)
    with_drafts, without = generate(llm, REPEATING, params), generate(plain_llm, REPEATING, params)
    assert accepted(llm) > 5
    for a, b in zip(with_drafts, without, strict=True):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x is not None and y is not None
            assert x.top_token_ids == y.top_token_ids and x.rank == y.rank
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)


def test_stops_inside_accepted_drafts(plain_llm: LLM, model_dir: Path) -> None:
    """A stop token, stop string or max_tokens met among accepted drafts ends the output there."""
    free = generate(plain_llm, REPEATING, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    stop_id = free[0].token_ids[12]
    stop_text = free[2].text[len(free[2].text) // 2 :][:3]
    cases = [SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=(stop_id,), ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=40, stop=(stop_text,), ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True)]
    for params in cases:
        llm = speculating_llm(model_dir)
        got, want = generate(llm, REPEATING, params), generate(plain_llm, REPEATING, params)
        assert [(o.token_ids, o.text, o.finish_reason) for o in got] == \
            [(o.token_ids, o.text, o.finish_reason) for o in want]
    assert len(want[0].token_ids) == 13


def test_a_row_takes_its_accepted_tokens_up_to_the_first_that_ends_it(plain_llm: LLM) -> None:
    """What a verifying row keeps, booked at once, is what booking its tokens one at a time keeps: stop tokens, EOS
    unless ignored, min_tokens, max_tokens and the context length, on random rows."""
    engine = plain_llm.engine
    eos = engine.eos_token_ids[0]
    rng = random.Random(0)
    for _ in range(500):
        max_tokens = rng.randint(1, 12)
        params = SamplingParams(max_tokens=max_tokens, min_tokens=rng.randint(0, max_tokens),
                                stop_token_ids=(3,) if rng.random() < 0.5 else (), ignore_eos=rng.random() < 0.5)
        prompt = [9] * rng.choice([4, engine.max_model_len - 8])
        num_outputs = rng.randint(0, min(max_tokens, engine.max_model_len - len(prompt)) - 1)  # its pending one fits
        sampled = [rng.choice([3, eos, 7, 8]) for _ in range(rng.randint(1, 6))]
        taken, one_at_a_time = (_decoding(prompt, params, max_tokens, num_outputs) for _ in range(2))
        kept = engine._take_tokens(taken, sampled)
        assert kept == _take_one_at_a_time(engine, one_at_a_time, sampled)
        assert (taken.token_ids, taken.num_tokens) == (one_at_a_time.token_ids, one_at_a_time.num_tokens)


def _decoding(prompt: list[int], params: SamplingParams, max_tokens: int, num_outputs: int) -> Sequence:
    """A sequence with `num_outputs` tokens booked and its next one pending."""
    seq = Sequence("r", prompt, params, max_tokens)
    seq.token_ids += [8] * num_outputs
    seq.num_tokens += num_outputs
    seq.add_pending_token(0, is_last=False)
    return seq


def _take_one_at_a_time(engine: LLMEngine, seq: Sequence, token_ids: list[int]) -> tuple[int, FinishReason | None]:
    seq.resolve_pending_token(token_ids[0])
    finish_reason = engine._finish_reason(seq, token_ids[0])
    num_kept = 1
    while finish_reason is None and num_kept < len(token_ids):
        seq.token_ids.append(token_ids[num_kept])
        seq.num_tokens += 1
        finish_reason = engine._finish_reason(seq, token_ids[num_kept])
        num_kept += 1
    return num_kept, finish_reason


def test_penalties_and_bias_compose(plain_llm: LLM, model_dir: Path) -> None:
    """Penalized sequences decode without drafts (their counts would need the drafts); logit bias is the same at
    every position, so biased ones verify drafts."""
    penalized = SamplingParams(temperature=0.0, max_tokens=30, presence_penalty=0.5, repetition_penalty=1.2)
    biased = SamplingParams(temperature=0.0, max_tokens=30, logit_bias=((7, 3.0), (400, -5.0)), ignore_eos=True)
    llm = speculating_llm(model_dir)
    got = generate(llm, REPEATING * 2, [penalized] * 3 + [biased] * 3)
    assert tokens(got) == tokens(generate(plain_llm, REPEATING * 2, [penalized] * 3 + [biased] * 3))
    assert accepted(llm) > 0
    llm = speculating_llm(model_dir)
    generate(llm, REPEATING, penalized)
    assert llm.engine.speculation.counts.num_drafts == 0  # type: ignore[union-attr]


def test_several_choices_of_one_prompt_and_prefix_cache_hits(plain_llm: LLM, model_dir: Path) -> None:
    """n > 1 (one sequence per choice, sharing the prompt's cached blocks) and a second run served from the
    prefix cache, whose keys hold accepted tokens only."""
    prompts = [REPEATING[2]] * 3 + [REPEATING[0]]
    params = [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)] + \
        [SamplingParams(temperature=0.5, seed=s, max_tokens=30, ignore_eos=True) for s in (7, 8, 9)]
    llm = speculating_llm(model_dir)
    want = tokens(generate(plain_llm, prompts, params))
    assert tokens(generate(llm, prompts, params)) == want
    hits = llm.engine.stats().num_prefix_cache_hit_tokens
    assert tokens(generate(llm, prompts, params)) == want
    assert llm.engine.stats().num_prefix_cache_hit_tokens > hits


def test_preemption_recomputes_accepted_tokens(model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    prompts = REPEATING + PLAIN
    plain = LLM(str(model_dir), kv_cache_blocks=24, **COMMON)
    llm = speculating_llm(model_dir, kv_cache_blocks=24)
    assert tokens(generate(llm, prompts, params)) == tokens(generate(plain, prompts, params))
    assert llm.engine.stats().num_preemptions > 0 and accepted(llm) > 0


def test_synchronous_scheduling_too(plain_llm: LLM, model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    llm = speculating_llm(model_dir, async_scheduling=False)
    assert tokens(generate(llm, REPEATING, params)) == tokens(generate(plain_llm, REPEATING, params))
    assert accepted(llm) > 0


def test_structured_output_verifies_drafts_under_its_grammar(plain_llm: LLM, model_dir: Path) -> None:
    """Constrained sequences verify drafts cut to their grammar, each position masked by the grammar's state after
    the drafts before it, in the same steps as unconstrained ones (masks land on their own positions)."""
    from core.structured_output import StructuredOutput

    regex = StructuredOutput(regex=r"(ab?c ){3,14}")
    constrained = SamplingParams(temperature=0.0, max_tokens=40, structured_output=regex)
    free = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    prompts = REPEATING + [PLAIN[0]]
    params = [free, constrained, free, constrained]
    llm = speculating_llm(model_dir)
    got = generate(llm, prompts, params)
    assert [(o.token_ids, o.text) for o in got] == [(o.token_ids, o.text) for o in generate(plain_llm, prompts, params)]
    assert all(re.fullmatch(r"(ab?c ){3,14}", got[i].text) for i in (1, 3)), [got[i].text for i in (1, 3)]
    alone = speculating_llm(model_dir)
    assert tokens(generate(alone, [prompts[1]], constrained)) == tokens([got[1]])
    assert accepted(alone) > 5


def draft_model_llm(model_dir: Path, draft_dir: Path, **settings: object) -> LLM:
    settings = {"kv_cache_blocks": 128, **COMMON, **settings}
    return LLM(str(model_dir), speculative_config={"model": str(draft_dir), "num_speculative_tokens": 3,
                                                   "adaptive": False}, **settings)


def test_a_draft_model_that_is_the_target_has_every_draft_accepted(plain_llm: LLM, model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    prompts = REPEATING + PLAIN
    llm = draft_model_llm(model_dir, model_dir)
    assert tokens(generate(llm, prompts, params)) == tokens(generate(plain_llm, prompts, params))
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_draft_tokens > 100 and counts.num_accepted_tokens == counts.num_draft_tokens
    # Its own prefix-cache hits and a second run: the draft writes its own K/V wherever it has none.
    assert tokens(generate(llm, prompts, params)) == tokens(generate(plain_llm, prompts, params))
    assert llm.engine.stats().num_prefix_cache_hit_tokens > 0
    assert counts.num_accepted_tokens == counts.num_draft_tokens


def perturbed_copy(model_dir: Path, directory: Path) -> Path:
    """The checkpoint with noise on its MLP weights: a draft that agrees with it often, not always."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, directory, dirs_exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for path in directory.glob("*.safetensors"):
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if "mlp" in name:
                tensor += 0.3 * tensor.std() * torch.randn(tensor.shape, generator=generator)
        save_file(tensors, path, metadata={"format": "pt"})
    return directory


def test_another_draft_model_changes_nothing_but_speed(plain_llm: LLM, model_dir: Path,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A draft of other weights (same vocabulary): some drafts rejected, the output the target's alone, with
    preemptions that drop the draft's K/V along with the blocks."""
    draft_dir = perturbed_copy(model_dir, tmp_path_factory.mktemp("draft"))
    params = [SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True),
              SamplingParams(temperature=0.7, seed=11, max_tokens=50, ignore_eos=True)] * 3
    prompts = REPEATING + PLAIN + [PLAIN[0]]
    llm = draft_model_llm(model_dir, draft_dir, kv_cache_blocks=28)
    plain = LLM(str(model_dir), kv_cache_blocks=28, **COMMON)
    assert tokens(generate(llm, prompts, params)) == tokens(generate(plain, prompts, params))
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens
    assert llm.engine.stats().num_preemptions > 0


def test_tensor_parallel_ranks_verify_the_same_positions(plain_llm: LLM, model_dir: Path,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under tensor parallelism every rank computes the verified positions' logits share (rank 0 samples); a draft
    model runs on the target's ranks in worker processes of its own, which the engine stops with the target's."""
    from gpu.tensor_parallel_runner import TensorParallelRunner

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    draft_dir = perturbed_copy(model_dir, tmp_path_factory.mktemp("tp-draft"))
    llm = draft_model_llm(model_dir, draft_dir, tensor_parallel_size=2)
    draft_runner = llm.engine.speculation.proposer.runner  # type: ignore[union-attr]
    assert isinstance(draft_runner, TensorParallelRunner) and draft_runner is not llm.engine.runner
    try:
        assert tokens(generate(llm, REPEATING, params)) == tokens(generate(plain_llm, REPEATING, params))
        counts = llm.engine.speculation.counts  # type: ignore[union-attr]
        assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens
    finally:
        llm.engine.close()
    assert all(w.process.poll() is not None for w in draft_runner._workers)  # noqa: SLF001 - stopped with the engine


def recorded_step_times(speculation: object) -> list[float]:
    """The step times the engine gives its speculation from now on, in a list that fills as it runs."""
    observed: list[float] = []
    observe = speculation.observe_step  # type: ignore[attr-defined]

    def recording(batch_size: int, num_drafts: int, seconds: float) -> None:
        observed.append(seconds)
        observe(batch_size, num_drafts, seconds)

    speculation.observe_step = recording  # type: ignore[attr-defined]
    return observed


def test_the_controller_times_a_step_until_the_next_one_starts(model_dir: Path) -> None:
    """The host's work between steps (a server sends the rows' tokens) is part of a step's cost, as it idles the
    device after a verifying step; the engine waiting for requests is no step's cost."""
    engine = speculating_llm(model_dir, num_drafts=None).engine
    speculation = engine.speculation
    assert speculation is not None
    observed = recorded_step_times(speculation)
    engine.add_request("a", REPEATING[2], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))
    while not observed:  # until a decode step's time is given
        engine.step()
    engine.step()
    time.sleep(0.05)
    engine.step()
    assert observed[-1] >= 0.05
    num_observed = len(observed)
    engine.wait_for_work(timeout=0.05)
    engine.step()
    assert len(observed) == num_observed


def test_the_wait_after_the_last_request_is_no_step_cost(model_dir: Path) -> None:
    """A caller that steps only while there is work (LLM.generate) returns after the step that ends the last
    request; the time until it brings the next one is not that step's (with the target as its own draft model every
    decode step verifies, so the last one would be timed to the next step's start)."""
    llm = draft_model_llm(model_dir, model_dir)
    speculation = llm.engine.speculation
    assert speculation is not None
    observed = recorded_step_times(speculation)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    llm.generate([REPEATING[2]], params)
    num_observed = len(observed)
    time.sleep(0.2)
    llm.generate([REPEATING[0]], params)
    assert num_observed and len(observed) > num_observed
    assert max(observed) < 0.2


def test_with_the_controller_no_step_with_prompt_tokens_verifies_drafts(model_dir: Path) -> None:
    """A prompt arriving mid-stream is computed in steps without drafts (the controller measures decoding steps
    only); with a fixed draft length those steps verify drafts beside the prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def steps_with_both(num_drafts: int | None) -> int:
        engine = speculating_llm(model_dir, num_drafts=num_drafts).engine
        records = record_schedules(engine)
        engine.add_request("a", REPEATING[2], params)
        for i in range(3):  # prompts of 100 tokens, each computed over steps of the 64-token budget
            for _ in range(8):
                engine.step()
            engine.add_request(f"b{i}", list(range(100 + i, 200 + i)), params)
        while engine.has_unfinished_requests():
            engine.step()
        return sum(any(s.start < s.seq.num_prompt_tokens for s in out.scheduled)
                   and any(s.num_new_tokens > 1 and s.start >= s.seq.num_prompt_tokens for s in out.scheduled)
                   for out in records)

    assert steps_with_both(None) == 0
    assert steps_with_both(4) > 0


def test_suffix_decoding_drafts_from_earlier_outputs_too(plain_llm: LLM, model_dir: Path) -> None:
    """The second run of the same prompts finds their continuations among the first run's outputs."""
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.5, seed=3, max_tokens=40, ignore_eos=True)]
    prompts = [PLAIN[0], PLAIN[1]]
    llm = speculating_llm(model_dir, method="suffix")
    want = tokens(generate(plain_llm, prompts, params))
    assert tokens(generate(llm, prompts, params)) == want
    first_run = accepted(llm)
    assert tokens(generate(llm, prompts, params)) == want
    assert accepted(llm) - first_run > 30  # nearly every token of the repeated greedy and seeded outputs


def test_prompt_logprobs_beside_verifying_rows(plain_llm: LLM, model_dir: Path) -> None:
    """A prompt scored (prompt_logprobs) in the step that verifies others' drafts: its positions are not the
    verified ones."""
    free = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    scored = SamplingParams(temperature=0.0, max_tokens=5, prompt_logprobs=2)
    llm = speculating_llm(model_dir, max_num_batched_tokens=16)  # the scored prompt comes in chunks, among decodes
    prompts = REPEATING + [PLAIN[0]]
    got = generate(llm, prompts, [free] * 3 + [scored])
    want = generate(plain_llm, prompts, [free] * 3 + [scored])
    assert tokens(got) == tokens(want) and accepted(llm) > 0
    for a, b in zip(got[3].prompt_logprobs[1:], want[3].prompt_logprobs[1:], strict=True):  # type: ignore[index]
        assert a.top_token_ids == b.top_token_ids and a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_a_draft_model_catches_up_in_steps_of_the_token_budget(plain_llm: LLM, model_dir: Path) -> None:
    """Prompts longer than a step's budget: the draft computes their K/V over several launches, all accepted."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    llm = draft_model_llm(model_dir, model_dir, max_num_batched_tokens=16)
    assert tokens(generate(llm, PLAIN + REPEATING, params)) == tokens(generate(plain_llm, PLAIN + REPEATING, params))
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_draft_tokens > 50 and counts.num_accepted_tokens == counts.num_draft_tokens


def test_a_draft_model_catches_up_in_the_launch_of_its_first_drafts(plain_llm: LLM, model_dir: Path) -> None:
    """What the draft lacks before its first draft (a prompt, or after a verification the last kept draft and the
    bonus token) is computed in the launch that draws the first draft: drafting k tokens is k launches."""
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    llm = draft_model_llm(model_dir, model_dir, max_num_batched_tokens=128)  # every prompt's catch-up fits a launch
    proposer = llm.engine.speculation.proposer  # type: ignore[union-attr]
    launch, fill = proposer.runner.launch, proposer.fill  # type: ignore[union-attr]
    drafts_and_launches: list[list[int]] = []

    def counted_launch(batch: Batch) -> object:
        drafts_and_launches[-1][1] += 1
        return launch(batch)

    def counted_fill(scheduled: list[ScheduledSequence]) -> None:
        drafts_and_launches.append([max((s.end - s.seq.num_tokens for s in scheduled), default=0), 0])
        fill(scheduled)

    proposer.runner.launch, proposer.fill = counted_launch, counted_fill  # type: ignore[union-attr]
    assert tokens(generate(llm, PLAIN + REPEATING, params)) == tokens(generate(plain_llm, PLAIN + REPEATING, params))
    verified = [(drafts, launches) for drafts, launches in drafts_and_launches if drafts]
    assert len(verified) > 5 and all(drafts == launches for drafts, launches in verified), verified


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_a_windowed_model_gives_the_same_tokens_with_drafts(tmp_path: Path, family: str) -> None:
    """Gemma 3 keeps a full-attention group beside a window of 16, Mistral windowed layers only (24). Prompts run
    past the window and repeat, so drafts are accepted and rejected: verifying steps run while the windowed blocks
    before the window are released, and each rejected draft's blocks go back in every group. Seeded rows at
    temperature 1 beside the greedy ones reject drafts where the greedy rows would accept every one."""
    if not has_architecture(FAMILY_SPECS[family].architecture):
        pytest.skip(f"this transformers has no {family} model class")
    model_dir = build_tiny_model(tmp_path / family, FAMILY_SPECS[family])
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(model_dir), kv_cache_blocks=128, **COMMON)
    # A prompt that ends as an earlier part of it did, that part's continuation inside it: the n-gram drafts are
    # what the model goes on with (Mistral's two layers of window 24 see the last 48 tokens only, so it repeats).
    start = [(i * 37) % 450 + 3 for i in range(64)]  # no token twice
    continued = start + plain.generate([start], greedy)[0].token_ids + start
    prompts = [[70, 71, 72, 73] * 12, list(range(100, 137)) + [100, 101, 102] * 3, continued, *PLAIN]
    params = [greedy] * len(prompts) + [SamplingParams(temperature=1.0, seed=seed, max_tokens=40, ignore_eos=True)
                                        for seed in (1, 2)]
    prompts += prompts[:2]
    llm = speculating_llm(model_dir)
    windowed = [g for g, pool in enumerate(llm.engine.block_manager.pools) if pool.sliding_window is not None]
    assert windowed and len(llm.engine.block_manager.pools) == (2 if family == "gemma3" else 1)
    released_while_verifying = record_released_windowed_blocks_of_verifying_rows(llm, windowed)
    assert tokens(generate(llm, prompts, params)) == tokens(generate(plain, prompts, params))
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_accepted_tokens > 10 and counts.num_draft_tokens > counts.num_accepted_tokens
    assert released_while_verifying, "verifying rows held windowed tables with blocks released before the window"


def record_released_windowed_blocks_of_verifying_rows(llm: LLM, windowed: list[int]) -> list[int]:
    """Per step with some: the null entries of the windowed tables of rows that verify drafts."""
    engine = llm.engine
    released: list[int] = []
    schedule = engine.scheduler.schedule

    def recording_schedule() -> SchedulerOutput:
        out = schedule()
        null_entries = sum(s.seq.block_tables[g].count(engine.block_manager.pools[g].null_block)
                           for s in out.scheduled if s.seq.draft_token_ids for g in windowed)
        if null_entries:
            released.append(null_entries)
        return out

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    return released


def test_a_draft_model_for_a_windowed_target_is_refused_at_start(tmp_path: Path) -> None:
    if not has_architecture(FAMILY_SPECS["gemma3"].architecture):
        pytest.skip("this transformers has no gemma3 model class")
    model_dir = build_tiny_model(tmp_path / "gemma3", FAMILY_SPECS["gemma3"])
    with pytest.raises(ValueError, match="speculative_config.model: a draft model .*sliding-window layers"):
        draft_model_llm(model_dir, model_dir)
