"""Speculative decoding's method mtp on GLM-4-MoE (its first multi-token-prediction layer, numbered after the
decoder's, as DeepSeek V3's): with a random head (tests/mtp_heads.py) the greedy output equals the output without
drafts, and each draft is the head's prediction as transformers' own layers compute it."""

from pathlib import Path

import pytest

from core import LLM, SamplingParams
from tests.moe_models import MOE_CONFIGS, build_moe_model
from tests.mtp_heads import add_glm4_moe_mtp_layer, assert_drafts_are_the_heads, record_drafts
from tests.unit.test_speculative_hybrid import COMMON, PLAIN, REPEATING, generated

NUM_LAYERS = MOE_CONFIGS["glm4_moe"][1]["num_hidden_layers"]
SPECULATIVE = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dirs: dict[str, Path]) -> Path:
    directory = build_moe_model(tmp_path_factory.mktemp("glm4_moe_mtp"), "glm4_moe", tiny_model_dirs["qwen3"])
    add_glm4_moe_mtp_layer(directory, NUM_LAYERS)
    return directory


def test_mtp_drafts_keep_the_greedy_output(glm_dir: Path) -> None:
    prompts = REPEATING + PLAIN
    expected = generated(LLM(str(glm_dir), **COMMON), prompts)
    llm = LLM(str(glm_dir), **COMMON, speculative_config=SPECULATIVE)
    assert generated(llm, prompts) == expected
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_drafts > 0 and counts.num_draft_tokens > 2 * counts.num_drafts


def test_mtp_drafts_are_the_heads_predictions(glm_dir: Path) -> None:
    llm = LLM(str(glm_dir), **COMMON, speculative_config=SPECULATIVE)
    drafted = record_drafts(llm)
    generated(llm, [REPEATING[0], PLAIN[1]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert len(drafted) >= 10
    assert_drafts_are_the_heads(drafted, glm_dir, samples=6)


def test_a_checkpoint_without_its_mtp_layer_is_refused_at_start(tmp_path: Path,
                                                                tiny_model_dirs: dict[str, Path]) -> None:
    directory = build_moe_model(tmp_path / "glm", "glm4_moe", tiny_model_dirs["qwen3"])
    named = rf"speculative_config.method 'mtp': .*\(no tensor named model\.layers\.{NUM_LAYERS}\."
    with pytest.raises(ValueError, match=named):
        LLM(str(directory), **COMMON, speculative_config=SPECULATIVE)

