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

from core import SamplingParams
from gpu.layers.gated_delta_rule import CHUNK_SIZE
from tests.hybrid_models import HYBRID_CONFIGS, build_hybrid_model
from tests.parity import test_parity_cpu as dense

MODELS = tuple(HYBRID_CONFIGS)
LONG = (5, 70, 17, 1, 130)  # past one and two delta-rule chunks


@pytest.fixture(scope="module")
def hybrid_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrid-models")
    return {name: build_hybrid_model(root / name, name, tiny_model_dirs["qwen3"]) for name in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_batch_of_different_lengths(hybrid_dirs: dict[str, Path], model: str) -> None:
    prompts = dense.prompts_of_lengths(LONG)
    dense.assert_matches_hf(hybrid_dirs[model], prompts, dense.make_llm(hybrid_dirs[model]).generate(prompts,
                                                                                                        dense.GREEDY))


@pytest.mark.parametrize("model", MODELS)
def test_chunks_that_split_a_delta_rule_chunk(hybrid_dirs: dict[str, Path], model: str) -> None:
    llm = dense.make_llm(hybrid_dirs[model], max_tokens_per_step=48)
    records = dense.record_schedules(llm.engine)
    prompts = dense.prompts_of_lengths((150, 7, 90))
    outputs = llm.generate(prompts, dense.GREEDY)
    ends = [s.end for out in records for s in out.scheduled if s.start > 0 or s.end < s.seq.num_prompt_tokens]
    assert any(end % CHUNK_SIZE for end in ends if end < 150), "a prompt chunk ended inside a delta-rule chunk"
    assert len([s for out in records for s in out.scheduled if 0 < s.start < s.seq.num_prompt_tokens]) >= 3
    dense.assert_matches_hf(hybrid_dirs[model], prompts, outputs)


@pytest.mark.parametrize("model", MODELS)
def test_preemption_recomputes_the_state(hybrid_dirs: dict[str, Path], model: str) -> None:
    llm = dense.make_llm(hybrid_dirs[model], num_blocks=12, block_size=4)
    prompts = dense.prompts_of_lengths((7, 12, 3, 18, 9, 14))
    outputs = llm.generate(prompts, dense.GREEDY)
    assert llm.engine.stats().num_preemptions > 0
    dense.assert_matches_hf(hybrid_dirs[model], prompts, outputs)
    assert llm.engine.state_slots is not None and llm.engine.state_slots.num_free == 16, "every state slot returned"


@pytest.mark.parametrize("model", MODELS)
def test_requests_joining_a_running_batch(hybrid_dirs: dict[str, Path], model: str) -> None:
    engine = dense.make_llm(hybrid_dirs[model], max_tokens_per_step=24).engine
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
    for prompt, output in zip(prompts, dense.make_llm(hybrid_dirs[model]).generate(prompts, params), strict=True):
        assert output.token_ids == dense.hf_greedy(hybrid_dirs[model], prompt, max_new_tokens=40)


@pytest.mark.parametrize("model", MODELS)
def test_logits_close_to_transformers(hybrid_dirs: dict[str, Path], model: str) -> None:
    prompt = dense.prompts_of_lengths((100,))[0]
    llm = dense.make_llm(hybrid_dirs[model])
    output = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        theirs = torch.log_softmax(dense.hf_model(hybrid_dirs[model])(torch.tensor([prompt])).logits[0, -1], dim=-1)
    ours = output.logprobs[0]
    torch.testing.assert_close(torch.tensor(ours.top_logprobs), theirs[list(ours.top_token_ids)], rtol=1e-4, atol=1e-4)


def test_prefix_caching_is_off_for_hybrids(hybrid_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """Until the linear layers' states are kept at block boundaries, a shared prefix is recomputed: right tokens,
    no hits."""
    with caplog.at_level("INFO", logger="core.engine"):
        llm = dense.make_llm(hybrid_dirs["qwen3_5"])
    assert "prefix caching off" in caplog.text
    prompts = dense.prompts_of_lengths((3, 11), shared_prefix=48)
    outputs = llm.generate(prompts[:1], dense.GREEDY) + llm.generate(prompts[1:], dense.GREEDY)
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
        outputs = dense.make_llm(directory).generate(prompts, dense.GREEDY)
    assert "left out" in caplog.text and "checkpoint tensors" in caplog.text
    dense.assert_matches_hf(source, prompts, outputs)
