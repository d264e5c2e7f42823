"""Speculative decoding on CUDA (graphs on): verification steps run through the mixed path (a mixed graph where
the backend has them), decode steps through the decode graphs, and in float32 the output equals the output
without drafts; the target as its own draft model has every draft accepted; in bfloat16 a token that differs
is in the other run's top 5 (verification and decode read the weights through different kernels)."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.tiny_model import build_tiny_model
from tests.parity.test_parity_cpu import prompts_of_lengths
from tests.tiny_specs import FAMILY_SPECS, TINY_SPECS
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_verify_the_same_float32_tokens_as_without_drafts(model_dir: Path) -> None:
    """TP=2: both ranks run the verifying steps (graphs on), and the output is the one without drafts."""
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    config = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}
    outputs, accepted = {}, 0
    for spec in (None, config):
        llm = LLM(str(model_dir), dtype="float32", speculative_config=spec, tensor_parallel_size=2, **COMMON)
        try:
            outputs[spec is None] = [o.token_ids for o in llm.generate(PROMPTS, params)]
            if spec is not None:
                accepted = llm.engine.speculation.counts.num_accepted_tokens  # type: ignore[union-attr]
        finally:
            llm.engine.close()
    assert outputs[False] == outputs[True]
    assert accepted > 20


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


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_a_windowed_model_gives_the_same_float32_tokens_with_drafts(tmp_path: Path, family: str) -> None:
    """Gemma 3 (a full-attention group beside a windowed one) and Mistral (windowed layers only): verification
    steps read each group's tables while the windowed blocks before the window are released, prompts past the
    window, drafts accepted."""
    model_dir = build_tiny_model(tmp_path / family, FAMILY_SPECS[family])
    greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    settings = {**COMMON, "block_size": 4, "dtype": "float32"}
    plain = LLM(str(model_dir), **settings)
    start = [(i * 37) % 450 + 3 for i in range(64)]  # no token twice; its continuation inside the next prompt
    prompts = [[70, 71, 72, 73] * 12, start + plain.generate([start], greedy)[0].token_ids + start, *PLAIN]
    want = plain.generate(prompts, greedy)
    llm = LLM(str(model_dir), speculative_config={"method": "ngram", "num_speculative_tokens": 4, "adaptive": False},
              **settings)
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == [o.token_ids for o in want]
    assert any(pool.sliding_window is not None for pool in llm.engine.block_manager.pools)
    assert llm.engine.speculation.counts.num_accepted_tokens > 20  # type: ignore[union-attr]
    assert llm.engine.stats().num_used_blocks == 0


@pytest.fixture(scope="module")
def glm_mtp_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """A tiny GLM-4-MoE with a random multi-token-prediction layer (the tiny Qwen3's tokenizer beside it)."""
    from tests.moe_models import MOE_CONFIGS, build_moe_model
    from tests.mtp_heads import add_glm4_moe_mtp_layer

    directory = build_moe_model(tmp_path_factory.mktemp("glm-mtp-gpu"), "glm4_moe", model_dir)
    add_glm4_moe_mtp_layer(directory, MOE_CONFIGS["glm4_moe"][1]["num_hidden_layers"])
    return directory


def test_mtp_float32_output_equals_output_without_drafts_and_drafts_are_the_heads(glm_mtp_dir: Path) -> None:
    """Method mtp on CUDA (decode graphs keep the target's hidden states too): greedy output unchanged, and each
    draft is the head's prediction as transformers' layers compute it (on the CPU, float32)."""
    from tests.mtp_heads import assert_drafts_are_the_heads, record_drafts

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    config = {"method": "mtp", "num_speculative_tokens": 3}  # adaptive: plain decode steps (graphs) come between
    _, want = run(glm_mtp_dir, "float32", None, params)
    llm = LLM(str(glm_mtp_dir), dtype="float32", speculative_config=config, **COMMON)
    drafted = record_drafts(llm)
    got = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.engine.speculation.counts.num_draft_tokens > 0 and len(drafted) >= 5  # type: ignore[union-attr]
    assert_drafts_are_the_heads(drafted, glm_mtp_dir, samples=8)


def test_eagle3_float32_output_equals_output_without_drafts_and_drafts_are_the_heads(tmp_path: Path) -> None:
    """Method eagle3 on CUDA, in CUDA graphs (every forward, a graph's replay too, writes the layers' inputs into one
    buffer): greedy output unchanged, and each draft is the head's prediction as transformers' Llama parts compute
    it (on the CPU)."""
    from core.tiny_model import TinyModelSpec
    from tests.mtp_heads import ReferenceEagle3, record_drafts, write_eagle3_head

    target = build_tiny_model(tmp_path / "target", TinyModelSpec(architecture="llama", num_layers=4,
                                                                  tie_word_embeddings=False, seed=4))
    head = write_eagle3_head(tmp_path / "head", target)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    _, want = run(target, "float32", None, params)
    llm = LLM(str(target), dtype="float32", speculative_config={"method": "eagle3", "model": str(head),
                                                                "num_speculative_tokens": 3}, **COMMON)
    assert llm.engine.runner.decode is not None  # the decode graphs were captured
    drafted = record_drafts(llm)
    got = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert len(drafted) >= 5
    reference = ReferenceEagle3(target, head)
    for token_ids, drafts in drafted[:: max(1, len(drafted) // 8)]:
        assert reference.drafts(token_ids, len(drafts)) == drafts


@pytest.fixture(scope="module")
def qwen3_5_mtp_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """A tiny Qwen3.5 (Gated DeltaNet hybrid) with a random MTP head."""
    from tests.hybrid_models import build_hybrid_model
    from tests.mtp_heads import add_qwen3_next_mtp_head

    directory = build_hybrid_model(tmp_path_factory.mktemp("qwen3_5-mtp-gpu"), "qwen3_5", model_dir)
    add_qwen3_next_mtp_head(directory)
    return directory


@pytest.mark.parametrize("method", ["ngram", "mtp"])
def test_a_hybrid_gives_the_same_float32_tokens_with_drafts(qwen3_5_mtp_dir: Path, method: str) -> None:
    """Verified rows run the linear layers position by position (the decode kernel), rejected drafts' state restored
    from the rows saved after each token; plain decode steps replay the graphs between drafting ones."""
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    _, want = run(qwen3_5_mtp_dir, "float32", None, params)
    llm, got = run(qwen3_5_mtp_dir, "float32", {"method": method, "num_speculative_tokens": 3}, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.engine.speculation.counts.num_draft_tokens > 0  # type: ignore[union-attr]


def test_a_hybrids_mtp_drafts_are_the_heads_predictions(qwen3_5_mtp_dir: Path) -> None:
    """On the torch path of the linear layers (kernels off): fla's chunked kernels multiply float32 in TF32, so a
    random head's near ties would flip against the float32 reference."""
    from types import SimpleNamespace

    from core.config import engine_config
    from core.engine import LLMEngine, runner_config
    from gpu.config import KernelConfig
    from gpu.model_runner import ModelRunner
    from tests.greedy_agreement import generate
    from tests.hybrid_models import use_transformers_torch_delta_rule
    from tests.mtp_heads import assert_drafts_are_the_heads, record_drafts

    config = engine_config(str(qwen3_5_mtp_dir), dtype="float32", **COMMON,
                           speculative_config={"method": "mtp", "num_speculative_tokens": 3, "adaptive": False})
    engine = LLMEngine(config, runner=ModelRunner(replace(runner_config(config),
                                                          kernels=KernelConfig(fused_kernels=False))))
    drafted = record_drafts(SimpleNamespace(engine=engine))  # type: ignore[arg-type]
    generate(engine, PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert len(drafted) >= 5
    use_transformers_torch_delta_rule()  # the reference runs on the CPU: transformers' torch rule, not fla's
    assert_drafts_are_the_heads(drafted, qwen3_5_mtp_dir, samples=8)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("method", ["mtp", "eagle3", "draft_model"])
def test_two_ranks_draft_as_one_and_verify_the_float32_tokens_without_drafts(tmp_path: Path, model_dir: Path,
                                                                            method: str) -> None:
    """TP=2 (NCCL, graphs on) with a draft head on each rank's shard, or a draft model on worker processes of its own:
    the drafts are TP=1's and the tokens those without drafts, through prefix hits, some drafts accepted (the heads
    and the damped targets of tests/parity/test_tensor_parallel_speculation.py; a perturbed copy as the draft model)."""
    from tests.mtp_heads import record_drafts
    from tests.parity.test_tensor_parallel_speculation import BUILDERS
    from tests.unit.test_speculative_decoding import perturbed_copy

    if method == "draft_model":
        target, config = model_dir, {"method": "draft_model", "model": str(perturbed_copy(model_dir, tmp_path / "d")),
                                     "num_speculative_tokens": 3, "adaptive": False}
    else:
        target, config = BUILDERS[method](tmp_path, model_dir)
    prompts = prompts_of_lengths((3, 6, 1), shared_prefix=40)  # two full blocks of each later prompt hit the first's
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = {"TP=2 without drafts": (2, None), "TP=1": (1, config), "TP=2": (2, config)}
    drafts, outputs = {}, {}
    for name, (tp, spec) in runs.items():
        llm = LLM(str(target), dtype="float32", speculative_config=spec, tensor_parallel_size=tp, **COMMON)
        try:
            drafts[name] = record_drafts(llm) if spec is not None else []
            outputs[name] = [o.token_ids for p in prompts for o in llm.generate([p], params)]
            stats = llm.engine.stats()
            assert stats.num_prefix_cache_hit_tokens >= 2 * 32 and stats.num_used_blocks == 0
            if name == "TP=2":
                counts = llm.engine.speculation.counts  # type: ignore[union-attr]
                assert 0 < counts.num_accepted_tokens <= counts.num_draft_tokens
        finally:
            llm.engine.close()
    assert outputs["TP=2"] == outputs["TP=1"] == outputs["TP=2 without drafts"]
    assert drafts["TP=2"] == drafts["TP=1"] and len(drafts["TP=2"]) >= 10
