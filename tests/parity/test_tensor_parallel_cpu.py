"""Tensor parallelism on CPU: TP=2 (two gloo worker processes) gives exactly TP=1's float32 greedy tokens,
which are transformers' (the oracle), on every path the engine takes.

Models: Qwen3 (4 query heads, 2 KV heads: one KV head per rank, tied embedding), Llama with one KV head
(fewer KV heads than ranks: the head is replicated on both), a Llama with 2 KV heads, biases on every
projection (the row-parallel ones' added once) and a vocabulary of 509 (odd: the last rank's share is
padded), Phi-3 (its fused q/k/v and gate/up checkpoint tensors split per rank, a sliding window) and Gemma 4
(windows, per-layer head sizes and KV heads, shared KV, per-layer inputs). One TP=2 engine per model serves all
of its cases (starting worker processes is the main cost); each case counts that the engine took the path it is
about, as tests/parity/test_parity_cpu.py does.
"""

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from core.structured_output import StructuredOutput
from gpu.runner import Runner
from tests.parity.test_parity_cpu import hf_greedy, prompts_of_lengths, record_schedules

MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
MODELS = ("qwen3", "llama", "llama-biases-odd-vocab", "phi3", "gemma4")


def build_llama_with_biases(directory: Path, tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    eos = AutoTokenizer.from_pretrained(tokenizer_dir).convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(vocab_size=509, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, attention_bias=True,
                         mlp_bias=True, initializer_range=0.2, tie_word_embeddings=False, eos_token_id=eos,
                         max_position_embeddings=2048)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.2)  # transformers starts biases at zero, which would test nothing
    model.save_pretrained(directory)
    for path in tokenizer_dir.glob("tokenizer*"):
        shutil.copy(path, directory / path.name)
    return directory


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    biased = build_llama_with_biases(tmp_path_factory.mktemp("llama-biases"), tiny_model_dirs["llama"])
    return {**tiny_model_dirs, "llama-biases-odd-vocab": biased}


def make_llm(model_dir: Path, tensor_parallel_size: int, **settings: object) -> LLM:
    # 20 blocks of 4 tokens and 16 tokens a step: long prompts are chunked and a batch cannot stay resident.
    return LLM(str(model_dir), device="cpu", dtype="float32", tensor_parallel_size=tensor_parallel_size, block_size=4,
               kv_cache_blocks=20, max_num_seqs=8, max_num_batched_tokens=16, **settings)


@pytest.fixture(scope="module", params=MODELS)
def engines(request: pytest.FixtureRequest, model_dirs: dict[str, Path]) -> Iterator[tuple[Path, LLM, LLM]]:
    if request.param not in model_dirs:
        pytest.skip(f"this transformers has no {request.param} model class")
    model_dir = model_dirs[request.param]
    sharded = make_llm(model_dir, 2)
    yield model_dir, make_llm(model_dir, 1), sharded
    sharded.engine.close()


def test_a_batch_that_is_chunked_and_preempted(engines: tuple[Path, LLM, LLM]) -> None:
    model_dir, single, sharded = engines
    assert isinstance(sharded.engine.runner, Runner) and isinstance(single.engine.runner, Runner)
    prompts = prompts_of_lengths((7, 12, 3, 18, 9, 14, 40))
    records = record_schedules(sharded.engine)
    before = sharded.engine.stats().num_preemptions
    tokens = [o.token_ids for o in sharded.generate(prompts, GREEDY)]
    assert sharded.engine.stats().num_preemptions > before
    assert sum(s.end < s.seq.num_prompt_tokens for out in records for s in out.scheduled) >= 3, "chunked prefill"
    assert tokens == [o.token_ids for o in single.generate(prompts, GREEDY)]
    assert tokens == [hf_greedy(model_dir, p, MAX_NEW_TOKENS) for p in prompts]
    assert sharded.engine.stats().num_used_blocks == 0


def test_shared_prefixes_hit_the_prefix_cache(engines: tuple[Path, LLM, LLM]) -> None:
    model_dir, single, sharded = engines
    prompts = prompts_of_lengths((3, 6, 1), shared_prefix=24)
    before = sharded.engine.stats().num_prefix_cache_hit_tokens
    tokens = [o.token_ids for p in prompts for o in sharded.generate([p], GREEDY)]  # one after another
    assert sharded.engine.stats().num_prefix_cache_hit_tokens - before >= 2 * 24
    assert tokens == [o.token_ids for o in single.generate(prompts, GREEDY)]
    assert tokens == [hf_greedy(model_dir, p, MAX_NEW_TOKENS) for p in prompts]


def test_logprobs_over_the_gathered_vocabulary_match(engines: tuple[Path, LLM, LLM]) -> None:
    _, single, sharded = engines
    prompts = prompts_of_lengths((5, 11))
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5)
    for ours, theirs in zip(sharded.generate(prompts, params), single.generate(prompts, params), strict=True):
        for a, b in zip(ours.logprobs, theirs.logprobs, strict=True):
            assert a.top_token_ids == b.top_token_ids
            torch.testing.assert_close(torch.tensor(a.top_logprobs), torch.tensor(b.top_logprobs), rtol=0, atol=1e-4)


def test_penalties_bias_prompt_logprobs_and_structured_output_go_through_rank_0(
    engines: tuple[Path, LLM, LLM],
) -> None:
    _, single, sharded = engines
    prompts = prompts_of_lengths((6, 13, 9))
    params = [
        SamplingParams(temperature=0.0, max_tokens=8, presence_penalty=0.8, frequency_penalty=0.5,
                       repetition_penalty=1.3, logit_bias=((17, 4.0), (30, -100.0))),
        SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=12, structured_output=StructuredOutput(regex=r"[a-z]{2,5}-\d{3}")),
    ]
    ours, theirs = sharded.generate(prompts, params), single.generate(prompts, params)
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]
    assert re.fullmatch(r"[a-z]{2,5}-\d{3}", ours[2].text), "the masks reached rank 0's sampler"
    for a, b in zip(ours[1].prompt_logprobs[1:], theirs[1].prompt_logprobs[1:], strict=True):
        assert a.top_token_ids == b.top_token_ids
        torch.testing.assert_close(a.logprob, b.logprob, rtol=0, atol=1e-4)
