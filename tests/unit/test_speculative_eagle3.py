"""Speculative decoding's method eagle3: an EAGLE-3 head in the speculators format (a random one: none can be had
here, tests/mtp_heads.py) on a tiny Llama target. The greedy output equals the output without drafts, and each draft
is the head's prediction as transformers' Llama parts compute it (the target's layers' inputs, fc, the head's layer
over [embedding; hidden], its draft vocabulary mapped by d2t)."""

from pathlib import Path

import pytest

from core import LLM, SamplingParams
from core.tiny_model import TinyModelSpec, build_tiny_model
from tests.mtp_heads import ReferenceEagle3, record_drafts, write_eagle3_head
from tests.unit.test_speculative_decoding import PLAIN, REPEATING

COMMON = dict(max_model_len=256, block_size=8, max_num_seqs=4, max_num_batched_tokens=64, dtype="float32",
              device="cpu", kv_cache_blocks=96)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("eagle3")
    target = build_tiny_model(root / "target", TinyModelSpec(architecture="llama", num_layers=4,
                                                              tie_word_embeddings=False, seed=4))
    return target, write_eagle3_head(root / "head", target)


def speculating(dirs: tuple[Path, Path], num_drafts: int = 3) -> LLM:
    target, head = dirs
    return LLM(str(target), **COMMON, speculative_config={"method": "eagle3", "model": str(head),
                                                         "num_speculative_tokens": num_drafts, "adaptive": False})


def test_eagle3_drafts_keep_the_greedy_output(dirs: tuple[Path, Path]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    prompts = REPEATING + PLAIN
    want = [o.token_ids for o in LLM(str(dirs[0]), **COMMON).generate(prompts, params)]
    llm = speculating(dirs)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_drafts > 0 and counts.num_draft_tokens > 2 * counts.num_drafts
    assert llm.engine.stats().num_used_blocks == 0


def test_eagle3_drafts_are_the_heads_predictions(dirs: tuple[Path, Path]) -> None:
    llm = speculating(dirs)
    drafted = record_drafts(llm)
    llm.generate([REPEATING[0], PLAIN[1]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert len(drafted) >= 10
    reference = ReferenceEagle3(*dirs)
    for token_ids, drafts in drafted[:: max(1, len(drafted) // 6)]:
        assert reference.drafts(token_ids, len(drafts)) == drafts


def test_a_directory_that_is_not_an_eagle3_head_is_refused_at_start(dirs: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="not an EAGLE-3 head in the speculators format"):
        LLM(str(dirs[0]), **COMMON, speculative_config={"method": "eagle3", "model": str(dirs[0])})


def test_a_target_with_sliding_window_layers_is_refused_at_start(tmp_path: Path) -> None:
    from dataclasses import replace

    from tests.tiny_specs import FAMILY_SPECS

    target = build_tiny_model(tmp_path / "mistral", replace(FAMILY_SPECS["mistral"], num_layers=4))
    head = write_eagle3_head(tmp_path / "head", target)
    with pytest.raises(ValueError, match="a draft head needs a target whose layers all keep the whole context"):
        LLM(str(target), **COMMON, speculative_config={"method": "eagle3", "model": str(head)})
