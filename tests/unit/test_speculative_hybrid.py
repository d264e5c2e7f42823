"""Speculative decoding on the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): a verified row advances the linear layers'
state over every draft, so after a rejection the next row restores the state saved after the last kept token. The
greedy output with drafts equals the output without them, drafts were accepted and rejected both (else the equality
would prove nothing), and every block is free at the end."""

from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.sequence import Sequence
from gpu.layers.gated_deltanet import GatedDeltaNet
from tests.hybrid_models import build_hybrid_model
from tests.mtp_heads import add_qwen3_next_mtp_head, assert_drafts_are_the_heads, record_drafts

COMMON = dict(max_model_len=256, block_size=8, max_num_seqs=4, max_num_batched_tokens=64, dtype="float32",
              device="cpu", kv_cache_blocks=96)
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [40, 41, 42, 40, 41, 42, 40, 41], [70, 71, 72, 73] * 6]
PLAIN = [list(range(100, 131)), [3, 99, 250, 17, 480, 61]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def hybrid_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               tiny_model_dirs: dict[str, Path]) -> Path:
    return build_hybrid_model(tmp_path_factory.mktemp(request.param), request.param, tiny_model_dirs["qwen3"])


def generated(llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] = GREEDY
              ) -> list[list[int]]:
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
def test_partly_accepted_drafts_on_a_hybrid_keep_the_greedy_output(hybrid_dir: Path, prefix_caching: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifying rows run position by position (every row's i-th token at once), the state after each kept."""
    prompts = REPEATING + PLAIN
    expected = generated(LLM(str(hybrid_dir), enable_prefix_caching=prefix_caching, **COMMON), prompts)
    llm = speculating(hybrid_dir, prefix_caching)
    llm.engine.speculation.proposer = KnownContinuation(prompts, expected)  # type: ignore[union-attr,assignment]
    by_position = GatedDeltaNet._by_position
    calls = []
    monkeypatch.setattr(GatedDeltaNet, "_by_position", lambda *args: calls.append(1) or by_position(*args))
    assert generated(llm, prompts) == expected
    assert calls
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    per_position = counts.accepted_per_position
    assert per_position[0] > per_position[1] > per_position[2] > 0  # none, some and all accepted, each often
    assert counts.num_draft_tokens > counts.num_accepted_tokens


def test_ngram_drafts_on_a_hybrid_keep_the_greedy_output(hybrid_dir: Path) -> None:
    expected = generated(LLM(str(hybrid_dir), **COMMON), REPEATING + PLAIN)
    llm = speculating(hybrid_dir, True)
    assert generated(llm, REPEATING + PLAIN) == expected
    assert llm.engine.speculation.counts.num_draft_tokens > 0  # type: ignore[union-attr]


# The MTP head (method mtp): a random head (tests/mtp_heads.py) verifies as any proposer does; its
# drafts are what transformers' own layers compute for the head; a head that predicts what the target will say has
# every draft accepted.


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def mtp_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            tiny_model_dirs: dict[str, Path]) -> Path:
    directory = build_hybrid_model(tmp_path_factory.mktemp(request.param + "_mtp"), request.param,
                                   tiny_model_dirs["qwen3"])
    add_qwen3_next_mtp_head(directory)
    return directory


def test_mtp_drafts_keep_the_greedy_output(mtp_dir: Path) -> None:
    prompts = REPEATING + PLAIN
    expected = generated(LLM(str(mtp_dir), **COMMON), prompts)
    llm = speculating(mtp_dir, True, method="mtp")
    assert generated(llm, prompts) == expected
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_drafts > 0 and counts.num_draft_tokens > 2 * counts.num_drafts  # 3 a row, fewer near the end
    assert llm.engine.stats().num_spec_draft_tokens == counts.num_draft_tokens


def test_mtp_drafts_are_the_heads_predictions(mtp_dir: Path) -> None:
    """Each draft the engine verified is the head's greedy prediction as transformers' own layers compute it: the
    target's last hidden states, then the head over every position so far (its later drafts on its own output)."""
    llm = speculating(mtp_dir, True, method="mtp")
    drafted = record_drafts(llm)
    generated(llm, [REPEATING[0], PLAIN[1]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert len(drafted) >= 10
    assert_drafts_are_the_heads(drafted, mtp_dir, samples=6)


def predicting_head(model_dir: Path) -> None:
    """Makes the checkpoint a bigram model (every layer's output projection zero: the last hidden state at p is the
    final norm of token p's embedding) and its MTP head the same map one token on (fc passes the normed embedding of
    token p + 1, its layer adds nothing, its norm is the target's final norm): each draft is the token the target
    will choose, so every draft is accepted."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    for name, tensor in tensors.items():
        if any(part in name for part in ("o_proj", "out_proj", "down_proj")):
            tensor.zero_()
    hidden_size = tensors["model.norm.weight"].shape[0]
    tensors["mtp.fc.weight"] = torch.cat([torch.eye(hidden_size), torch.zeros(hidden_size, hidden_size)], dim=1)
    tensors["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(hidden_size)
    tensors["mtp.norm.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_head_that_predicts_the_target_has_every_draft_accepted(tmp_path: Path,
                                                                   tiny_model_dirs: dict[str, Path]) -> None:
    model_dir = build_hybrid_model(tmp_path / "bigram", "qwen3_5", tiny_model_dirs["qwen3"])
    add_qwen3_next_mtp_head(model_dir)
    predicting_head(model_dir)
    prompts = REPEATING + PLAIN
    expected = generated(LLM(str(model_dir), **COMMON), prompts)
    llm = speculating(model_dir, True, method="mtp")
    assert generated(llm, prompts) == expected
    counts = llm.engine.speculation.counts  # type: ignore[union-attr]
    assert counts.num_draft_tokens > 50 and counts.num_accepted_tokens == counts.num_draft_tokens


def test_mtp_without_the_heads_weights_is_refused_at_start(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> None:
    model_dir = build_hybrid_model(tmp_path / "no_head", "qwen3_5", tiny_model_dirs["qwen3"])
    with pytest.raises(ValueError, match=r"speculative_config.method 'mtp': .* no multi-token-prediction head .*mtp\."):
        speculating(model_dir, True, method="mtp")


def test_mtp_for_a_family_without_a_head_is_refused_at_start(tiny_model_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"speculative_config.method 'mtp': no multi-token-prediction head is run"):
        speculating(tiny_model_dirs["qwen3"], True, method="mtp")


def test_mtp_with_the_measured_controller_and_seeded_sampling(mtp_dir: Path) -> None:
    """Plain steps (queued asynchronously) between drafting ones keep the head's inputs too; a seeded request draws
    the tokens it draws without drafts."""
    prompts = REPEATING + PLAIN
    seeded = [SamplingParams(temperature=0.8, seed=7 + i, max_tokens=24, ignore_eos=True) for i in range(len(prompts))]
    plain = LLM(str(mtp_dir), **COMMON)
    llm = LLM(str(mtp_dir), **COMMON, speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    assert generated(llm, prompts) == generated(plain, prompts)
    assert generated(llm, prompts, seeded) == generated(plain, prompts, seeded)
    assert llm.engine.speculation.counts.num_draft_tokens > 0  # type: ignore[union-attr]
