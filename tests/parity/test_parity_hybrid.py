"""The oracle for the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, Qwen3.5-MoE): with the same weights, our greedy
tokens equal transformers' (float32, CPU). Prompts run past the delta rule's chunk of 64 tokens; each case checks it
took its path: prompts prefilled in chunks that end inside a delta-rule chunk (so the state is carried across steps
mid-chunk), preemption (a recomputed sequence starts its state again), requests joining a running batch (decode
and prefill rows in one step), and the language model of an image-text checkpoint, whose vision tower and
multi-token-prediction head are left out."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core import LLM, SamplingParams
from core.engine import LLMEngine
from core.scheduler import SchedulerOutput
from gpu.layers.gated_delta_rule import CHUNK_SIZE
from tests.hybrid_models import HYBRID_CONFIGS, build_hybrid_model, with_slow_decays
from tests.parity import test_parity_cpu as dense

MODELS = tuple(HYBRID_CONFIGS)
LONG = (5, 70, 17, 1, 130)  # past one and two delta-rule chunks


def make_llm(model_dir: Path, num_blocks: int = 256, block_size: int = 16, max_tokens_per_step: int = 512,
             **settings: object) -> LLM:
    return LLM(str(model_dir), dtype="float32", block_size=block_size, kv_cache_blocks=num_blocks, max_num_seqs=16,
               max_num_batched_tokens=max_tokens_per_step, **settings)


def assert_states_idle(engine: LLMEngine) -> None:
    """Every state slot back in its pool; every snapshot row free or keyed."""
    states = engine.linear_states
    assert states is not None and states.slots.num_free == 16
    if states.snapshots is not None:
        assert len(states.snapshots.free_rows) + states.snapshots.num_keyed == states.snapshots.num_snapshots


def first_starts(records: list[SchedulerOutput]) -> list[int]:
    """Where each sequence's first scheduled row began (its prefix hit), in the order of their first admission."""
    starts: dict[int, int] = {}
    for out in records:
        for s in out.scheduled:
            starts.setdefault(id(s.seq), s.start)
    return list(starts.values())


@pytest.fixture(scope="module")
def hybrid_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrid-models")
    # Slow decays: the random ones forget within a few tokens, so a state carried or restored wrong would not show.
    return {name: with_slow_decays(build_hybrid_model(root / name, name, tiny_model_dirs["qwen3"])) for name in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_batch_of_different_lengths(hybrid_dirs: dict[str, Path], model: str) -> None:
    prompts = dense.prompts_of_lengths(LONG)
    dense.assert_matches_hf(hybrid_dirs[model], prompts, make_llm(hybrid_dirs[model]).generate(prompts,
                                                                                                        dense.GREEDY))


@pytest.mark.parametrize("model", MODELS)
def test_chunks_that_split_a_delta_rule_chunk(hybrid_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(hybrid_dirs[model], max_tokens_per_step=48)
    records = dense.record_schedules(llm.engine)
    prompts = dense.prompts_of_lengths((150, 7, 90))
    outputs = llm.generate(prompts, dense.GREEDY)
    ends = [s.end for out in records for s in out.scheduled if s.start > 0 or s.end < s.seq.num_prompt_tokens]
    assert any(end % CHUNK_SIZE for end in ends if end < 150), "a prompt chunk ended inside a delta-rule chunk"
    assert len([s for out in records for s in out.scheduled if 0 < s.start < s.seq.num_prompt_tokens]) >= 3
    dense.assert_matches_hf(hybrid_dirs[model], prompts, outputs)


@pytest.mark.parametrize("model", MODELS)
def test_preemption_recomputes_the_state(hybrid_dirs: dict[str, Path], model: str) -> None:
    llm = make_llm(hybrid_dirs[model], num_blocks=12, block_size=4)
    prompts = dense.prompts_of_lengths((7, 12, 3, 18, 9, 14))
    outputs = llm.generate(prompts, dense.GREEDY)
    assert llm.engine.stats().num_preemptions > 0
    dense.assert_matches_hf(hybrid_dirs[model], prompts, outputs)
    assert_states_idle(llm.engine)


@pytest.mark.parametrize("model", MODELS)
def test_requests_joining_a_running_batch(hybrid_dirs: dict[str, Path], model: str) -> None:
    engine = make_llm(hybrid_dirs[model], max_tokens_per_step=24).engine
    records = dense.record_schedules(engine)
    prompts = dense.prompts_of_lengths((30, 4, 19, 41, 2))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    engine.add_request("0", prompts[0], dense.GREEDY)
    for index, prompt in enumerate(prompts[1:], start=1):
        for _ in range(3):
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        engine.add_request(str(index), prompt, dense.GREEDY)
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    assert any(any(s.num_new_tokens == 1 for s in out.scheduled) and any(s.num_new_tokens > 1 for s in out.scheduled)
               for out in records), "a step ran decode and prompt rows together"
    for index, prompt in enumerate(prompts):
        assert tokens[str(index)] == dense.hf_greedy(hybrid_dirs[model], prompt)


@pytest.mark.parametrize("model", MODELS)
def test_long_generations_match(hybrid_dirs: dict[str, Path], model: str) -> None:
    prompts = dense.prompts_of_lengths((3, 66))
    params = SamplingParams(temperature=0.0, max_tokens=40)
    for prompt, output in zip(prompts, make_llm(hybrid_dirs[model]).generate(prompts, params), strict=True):
        assert output.token_ids == dense.hf_greedy(hybrid_dirs[model], prompt, max_new_tokens=40)


@pytest.mark.parametrize("model", MODELS)
def test_logits_close_to_transformers(hybrid_dirs: dict[str, Path], model: str) -> None:
    prompt = dense.prompts_of_lengths((100,))[0]
    llm = make_llm(hybrid_dirs[model])
    output = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        theirs = torch.log_softmax(dense.hf_model(hybrid_dirs[model])(torch.tensor([prompt])).logits[0, -1], dim=-1)
    ours = output.logprobs[0]
    torch.testing.assert_close(torch.tensor(ours.top_logprobs), theirs[list(ours.top_token_ids)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", MODELS)
def test_a_later_turn_resumes_from_the_saved_state(hybrid_dirs: dict[str, Path], model: str) -> None:
    """A prompt that extends an earlier prompt and its output (the next turn of a chat) starts from the snapshot at
    the earlier prompt's last block boundary or later: it never re-runs the shared part."""
    llm = make_llm(hybrid_dirs[model])
    records = dense.record_schedules(llm.engine)
    first_prompt = dense.prompts_of_lengths((70,))[0]
    first = llm.generate([first_prompt], dense.GREEDY)[0]
    second_prompt = first_prompt + first.token_ids + dense.prompts_of_lengths((9,))[0]
    second = llm.generate([second_prompt], dense.GREEDY)[0]
    starts = first_starts(records)
    assert starts[0] == 0 and starts[1] >= 64, "the second turn resumed after the first prompt's last boundary"
    assert llm.engine.stats().num_prefix_cache_hit_tokens == starts[1]
    dense.assert_matches_hf(hybrid_dirs[model], [first_prompt, second_prompt], [first, second])
    assert_states_idle(llm.engine)


@pytest.mark.parametrize("model", MODELS)
def test_a_shared_prefix_hits_once_its_branch_point_is_saved(hybrid_dirs: dict[str, Path], model: str) -> None:
    """Prompts sharing 48 tokens then differing: the second finds the KV blocks but no state there, recomputes and
    saves the state at the branch point; the third and fourth resume from it."""
    llm = make_llm(hybrid_dirs[model])
    records = dense.record_schedules(llm.engine)
    prompts = dense.prompts_of_lengths((20, 11, 25, 5), shared_prefix=48)  # the first saves at 64, not 48
    outputs = [llm.generate([prompt], dense.GREEDY)[0] for prompt in prompts]
    assert first_starts(records) == [0, 0, 48, 48]
    assert llm.engine.stats().num_prefix_cache_hit_tokens == 2 * 48
    dense.assert_matches_hf(hybrid_dirs[model], prompts, outputs)
    assert_states_idle(llm.engine)


def test_hits_in_a_running_batch_with_chunked_prompts(hybrid_dirs: dict[str, Path]) -> None:
    """Requests sharing a prefix, admitted together and prefilled in chunks that the save points cut, with few
    snapshot rows (evicted as they are needed): the tokens stay transformers'."""
    llm = make_llm(hybrid_dirs["qwen3_next"], max_tokens_per_step=40, state_snapshots=3)
    prompts = dense.prompts_of_lengths((30, 7, 52, 19, 3, 41), shared_prefix=37)
    first = llm.generate(prompts[:2], dense.GREEDY)
    rest = llm.generate(prompts[2:], dense.GREEDY)
    assert llm.engine.stats().num_prefix_cache_hit_tokens >= 4 * 32
    dense.assert_matches_hf(hybrid_dirs["qwen3_next"], prompts, first + rest)
    assert_states_idle(llm.engine)


def test_no_snapshots_turns_prefix_caching_off(hybrid_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="core.engine"):
        llm = make_llm(hybrid_dirs["qwen3_5"], state_snapshots=0)
    assert "prefix caching off" in caplog.text
    prompts = dense.prompts_of_lengths((3, 11, 7), shared_prefix=48)
    outputs = [llm.generate([prompt], dense.GREEDY)[0] for prompt in prompts]
    assert llm.engine.stats().num_prefix_cache_hit_tokens == 0
    dense.assert_matches_hf(hybrid_dirs["qwen3_5"], prompts, outputs)


@pytest.mark.parametrize("model", ["qwen3_5", "qwen3_5_moe"])
def test_image_text_checkpoint_serves_its_language_model(hybrid_dirs: dict[str, Path], model: str, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The language model of a `...ForConditionalGeneration` checkpoint (tensors under `model.language_model.`),
    its vision tower and an MTP head left out with a log line: the text model's tokens."""
    import transformers

    source = hybrid_dirs[model]
    text = dense.hf_model(source)
    config_class = getattr(transformers, "Qwen3_5Config" if model == "qwen3_5" else "Qwen3_5MoeConfig")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    config = config_class(text_config=text.config.to_dict(), vision_config=vision, tie_word_embeddings=False)
    image_text = getattr(transformers, config_class.__name__.replace("Config", "ForConditionalGeneration"))(config)
    image_text.model.language_model.load_state_dict(text.model.state_dict())
    image_text.lm_head.load_state_dict(text.lm_head.state_dict())
    directory = tmp_path / "image-text"
    image_text.save_pretrained(directory)
    save_file({"mtp.fc.weight": torch.zeros(64, 128), "mtp.norm.weight": torch.zeros(64)},
              str(directory / "mtp.safetensors"))
    for path in source.glob("tokenizer*"):
        shutil.copy(path, directory / path.name)
    prompts = dense.prompts_of_lengths((9, 70))
    with caplog.at_level("INFO", logger="gpu.loader"):
        outputs = make_llm(directory).generate(prompts, dense.GREEDY)
    assert "left out" in caplog.text and "checkpoint tensors" in caplog.text
    dense.assert_matches_hf(source, prompts, outputs)
