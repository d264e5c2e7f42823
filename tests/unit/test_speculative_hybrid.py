"""Speculative decoding on the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): a verified row advances the linear layers'
state over every draft, so after a rejection the next row restores the state saved after the last kept token. The
greedy output with drafts equals the output without them, drafts were accepted and rejected both (else the equality
would prove nothing), and every block is free at the end."""

from pathlib import Path

import pytest

from core import LLM, SamplingParams
from core.sequence import Sequence
from tests.hybrid_models import build_hybrid_model

COMMON = dict(max_model_len=256, block_size=8, max_num_seqs=4, max_num_batched_tokens=64, dtype="float32",
              device="cpu", kv_cache_blocks=96)
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [40, 41, 42, 40, 41, 42, 40, 41], [70, 71, 72, 73] * 6]
PLAIN = [list(range(100, 131)), [3, 99, 250, 17, 480, 61]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def hybrid_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               tiny_model_dirs: dict[str, Path]) -> Path:
    return build_hybrid_model(tmp_path_factory.mktemp(request.param), request.param, tiny_model_dirs["qwen3"])


def generated(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    outputs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats.num_used_blocks == 0
    return [o.token_ids for o in outputs]


class KnownContinuation:
    """A proposer that knows each prompt's greedy output and drafts it with one token changed, at a draft index that
    moves with the sequence's length: every number of accepted drafts from none to all occurs."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]]) -> None:
        self.full = [p + o for p, o in zip(prompts, outputs, strict=True)]

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None:
        for seq, limit in zip(seqs, max_drafts, strict=True):
            n = len(seq.token_ids)
            full = next(f for f in self.full if f[:n] == seq.token_ids)
            drafts = full[n : n + limit]
            wrong = n % (limit + 1)  # == limit: all are right
            if wrong < len(drafts):
                drafts[wrong] = (drafts[wrong] + 1) % 512
            seq.draft_token_ids = drafts


def speculating(model_dir: Path, prefix_caching: bool, method: str = "ngram", num_drafts: int = 3) -> LLM:
    return LLM(str(model_dir), enable_prefix_caching=prefix_caching, **COMMON,
               speculative_config={"method": method, "num_speculative_tokens": num_drafts, "adaptive": False})


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_partly_accepted_drafts_on_a_hybrid_keep_the_greedy_output(hybrid_dir: Path, prefix_caching: bool) -> None:
    prompts = REPEATING + PLAIN
    expected = generated(LLM(str(hybrid_dir), enable_prefix_caching=prefix_caching, **COMMON), prompts)
    llm = speculating(hybrid_dir, prefix_caching)
    llm.engine.speculation.proposer = KnownContinuation(prompts, expected)  # type: ignore[union-attr,assignment]
    assert generated(llm, prompts) == expected
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    per_position = counts.accepted_per_position
    assert per_position[0] > per_position[1] > per_position[2] > 0  # none, some and all accepted, each often
    assert counts.num_draft_tokens > counts.num_accepted_tokens


def test_ngram_drafts_on_a_hybrid_keep_the_greedy_output(hybrid_dir: Path) -> None:
    expected = generated(LLM(str(hybrid_dir), **COMMON), REPEATING + PLAIN)
    llm = speculating(hybrid_dir, True)
    assert generated(llm, REPEATING + PLAIN) == expected
    assert llm.engine.speculation.counts.num_draft_tokens > 0  # type: ignore[union-attr]
