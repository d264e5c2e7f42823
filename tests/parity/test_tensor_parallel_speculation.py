"""Speculative decoding's draft heads under tensor parallelism on CPU: at TP=2 (two gloo worker processes, each
running the head on its shard, its K/V in each rank's cache) a GLM-4-MoE MTP layer and an EAGLE-3 head draw exactly
TP=1's drafts, and the float32 greedy tokens equal TP=1's and those without drafts, through prefix-cache hits, with
some drafts accepted and some rejected (heads set to predict the damped target: tests/predicting_heads.py)."""

from collections.abc import Callable
from pathlib import Path

import pytest

from core import LLM, SamplingParams
from core.tiny_model import TinyModelSpec, build_tiny_model
from tests.moe_models import MOE_CONFIGS, build_moe_model
from tests.mtp_heads import add_glm4_moe_mtp_layer, record_drafts, write_eagle3_head
from tests.parity.test_parity_cpu import prompts_of_lengths
from tests.parity.test_tensor_parallel_cpu import make_llm
from tests.predicting_heads import predicting_eagle3_head, predicting_glm4_moe_mtp_layer

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SHARED_PREFIX = 24


def glm4_moe_with_mtp_layer(directory: Path, tokenizer_dir: Path) -> tuple[Path, dict]:
    num_layers = MOE_CONFIGS["glm4_moe"][1]["num_hidden_layers"]
    target = build_moe_model(directory / "glm4_moe", "glm4_moe", tokenizer_dir)
    add_glm4_moe_mtp_layer(target, num_layers)
    # Damped enough that the target's next token is mostly the head's guess, not so much that context stops counting.
    predicting_glm4_moe_mtp_layer(target, num_layers, leak=0.01, head_leak=1.0)
    return target, {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}


def llama_with_eagle3_head(directory: Path, tokenizer_dir: Path) -> tuple[Path, dict]:
    target = build_tiny_model(directory / "llama", TinyModelSpec(architecture="llama", num_layers=4, seed=4,
                                                                 tie_word_embeddings=False))
    head = write_eagle3_head(directory / "head", target, draft_vocab_size=512, norm_before_residual=False)
    predicting_eagle3_head(head, target, leak=0.05, head_leak=0.15)
    return target, {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3, "adaptive": False}


BUILDERS: dict[str, Callable[[Path, Path], tuple[Path, dict]]] = {
    "mtp": glm4_moe_with_mtp_layer, "eagle3": llama_with_eagle3_head}


def one_after_another(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for p in prompts for o in llm.generate([p], GREEDY)]


@pytest.mark.parametrize("method", list(BUILDERS))
def test_a_draft_head_on_two_ranks_drafts_and_verifies_as_on_one(method: str, tmp_path: Path,
                                                                  tiny_model_dirs: dict[str, Path]) -> None:
    target, speculative_config = BUILDERS[method](tmp_path, tiny_model_dirs["qwen3"])
    prompts = prompts_of_lengths((3, 6, 1), shared_prefix=SHARED_PREFIX)  # the second and third hit the first's
    want = one_after_another(make_llm(target, 1), prompts)
    single = make_llm(target, 1, speculative_config=speculative_config)
    single_drafts = record_drafts(single)
    assert one_after_another(single, prompts) == want
    sharded = make_llm(target, 2, speculative_config=speculative_config)
    try:
        sharded_drafts = record_drafts(sharded)
        assert one_after_another(sharded, prompts) == want
        stats, counts = sharded.engine.stats(), sharded.engine.speculation.counts  # type: ignore[union-attr]
        assert stats.num_prefix_cache_hit_tokens >= 2 * SHARED_PREFIX and stats.num_used_blocks == 0
    finally:
        sharded.engine.close()
    assert sharded_drafts == single_drafts, "each rank's head drew rank 0's drafts"
    assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens

