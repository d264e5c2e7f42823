"""Speculative decoding on CUDA (graphs on): verification steps run through the mixed path (a mixed graph where
the backend has them), decode steps through the decode graphs, and in float32 the output equals the output
without drafts; the target as its own draft model has every draft accepted; in bfloat16 a token that differs
is in the other run's top 5 (verification and decode read the weights through different kernels)."""

from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.tiny_model import build_tiny_model
from tests.tiny_specs import TINY_SPECS
from tests.unit.test_speculative_decoding import PLAIN, REPEATING

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

COMMON = dict(max_model_len=512, block_size=16, kv_cache_blocks=256, max_num_seqs=16, max_num_batched_tokens=256,
              device="cuda")
PROMPTS = REPEATING + PLAIN


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("spec-gpu") / "qwen3", TINY_SPECS["qwen3"])


def run(model_dir: Path, dtype: str, speculative_config: dict | None, params: SamplingParams) -> tuple[LLM, list]:
    llm = LLM(str(model_dir), dtype=dtype, speculative_config=speculative_config, **COMMON)
    outputs = llm.generate(PROMPTS, params)
    assert llm.engine.stats().num_used_blocks == 0
    return llm, outputs


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_float32_output_equals_output_without_drafts(model_dir: Path, method: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=2)
    config = {"method": method, "num_speculative_tokens": 4, "adaptive": False}
    if method == "draft_model":
        config["model"] = str(model_dir)
    _, want = run(model_dir, "float32", None, params)
    llm, got = run(model_dir, "float32", config, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_accepted_tokens > 20
    if method == "draft_model":
        assert counts.num_accepted_tokens == counts.num_draft_tokens


def test_bfloat16_tokens_agree_within_top_5(model_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=5)
    _, want = run(model_dir, "bfloat16", None, params)
    llm, got = run(model_dir, "bfloat16", {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}, params)
    for a, b in zip(got, want, strict=True):
        for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True)):
            if x != y:  # the runs part here: each token among the other's top 5, then the texts differ
                assert x in b.logprobs[i].top_token_ids and y in a.logprobs[i].top_token_ids
                break
    assert llm.engine.speculation.counts.num_accepted_tokens > 20  # type: ignore[union-attr]
