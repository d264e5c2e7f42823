"""The real Gemma 3 270M against transformers, both from the same GGUF file (transformers' `gguf_file=` loader is the
oracle for the conversion: names, Gemma's norm shift, the K-quant dequantization, the config it derives), float32
on CPU, greedy: a short code prompt, and prompts past the 512-token sliding window, in one step, chunked, and as
prefix-cache hits; the tokenizer converted from the file's SentencePiece vocabulary against transformers'; and the
path `auto` serves it with on a CPU (packed weights, packed decode steps) against that float32 reference."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from core import LLM, SamplingParams
from core.model_files import resolve_model
from gpu.attention.variant import PLAIN
from gpu.cpu_kernels import load_cpu_kernels
from gpu.model_info import read_model_info
from tests.greedy_agreement import assert_diverge_rarely_near_ties
from tests.parity.test_parity_cpu import whole_prompt_batch
from tests.transformers_gguf import transformers_from_gguf

MAX_TOKENS = 12
WINDOW = 512
TEXTS = ["def fibonacci(n):", "The capital of France is", "café 你好 🙂 <start_of_turn>user\nHi<end_of_turn>\n"]


@pytest.fixture(scope="module")
def gemma3_dir(gemma3_270m_gguf_path: Path) -> Path:
    """The file converted as `openai-serve gemma-3-270m-q4_k_m.gguf` converts it (once, into the cache)."""
    return resolve_model(str(gemma3_270m_gguf_path), "float32", "cpu").path


@pytest.fixture(scope="module")
def hf_oracle(gemma3_270m_gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return transformers_from_gguf(gemma3_270m_gguf_path)


@pytest.fixture(scope="module")
def hf_model(hf_oracle: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> PreTrainedModel:
    return hf_oracle[0]


@pytest.fixture(scope="module")
def llm(gemma3_dir: Path) -> LLM:
    return LLM(str(gemma3_dir), device="cpu", dtype="float32", max_model_len=2048, kv_cache_blocks=256,
               max_num_seqs=8, max_num_batched_tokens=2048)


@pytest.fixture(scope="module")
def raw_llm(gemma3_dir: Path) -> LLM:
    """An engine whose runner a test calls directly: its steps write the KV cache's first blocks, which `llm`'s
    prefix cache may hold for later requests."""
    return LLM(str(gemma3_dir), device="cpu", dtype="float32", max_model_len=2048, kv_cache_blocks=256,
               max_num_seqs=8, max_num_batched_tokens=2048)


@pytest.fixture(scope="module")
def long_prompts(llm: LLM) -> list[list[int]]:
    """Three prompts of about 600-900 tokens (past the window), the last two sharing their first 560 tokens."""
    lines = [f"Entry {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7 % 23} stones." for i in range(90)]
    tokens = llm.tokenizer.encode("\n".join(lines))
    prompts = [tokens[:610], tokens[:700], tokens[:560] + tokens[-300:]]
    assert all(len(p) > WINDOW + 16 for p in prompts)
    return prompts


@dataclass(frozen=True)
class HfAnswer:
    token_ids: list[int]
    first_logits: torch.Tensor  # [vocab]: at the prompt's last position


@pytest.fixture(scope="module")
def hf_long_answers(hf_model: PreTrainedModel, long_prompts: list[list[int]]) -> list[HfAnswer]:
    """transformers' greedy answers to the long prompts, run once for every test that compares with them."""
    return [hf_answer(hf_model, p) for p in long_prompts]


def hf_answer(model: PreTrainedModel, prompt: list[int], max_new_tokens: int = MAX_TOKENS) -> HfAnswer:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    return HfAnswer(out.sequences[0, len(prompt):].tolist(), out.logits[0][0])


def test_the_tokenizer_and_the_end_of_turn_equal_transformers(
        llm: LLM, gemma3_dir: Path, hf_oracle: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> None:
    theirs = hf_oracle[1]
    for text in TEXTS:
        assert llm.tokenizer.encode(text) == theirs.encode(text), text
    assert llm.tokenizer.encode("Hi")[0] == 2  # the file says to add BOS
    eos, end_of_turn = theirs.convert_tokens_to_ids(["<eos>", "<end_of_turn>"])
    assert read_model_info(gemma3_dir).eos_token_ids == (eos, end_of_turn)  # generation stops at either


def test_fibonacci_continues_as_transformers_does(llm: LLM, hf_model: PreTrainedModel) -> None:
    prompt = llm.tokenizer.encode("def fibonacci(n):")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20))[0]
    assert out.token_ids == hf_answer(hf_model, prompt, 20).token_ids
    assert out.text.startswith("\n    if n == 0:\n        return 0\n    elif n == 1")


def test_prompts_past_the_window_equal_transformers(llm: LLM, long_prompts: list[list[int]],
                                                    hf_long_answers: list[HfAnswer]) -> None:
    expected = [a.token_ids for a in hf_long_answers]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    assert [o.token_ids for o in llm.generate(long_prompts, greedy)] == expected
    hits_before = llm.engine.stats().num_prefix_cache_hit_tokens
    assert [o.token_ids for o in llm.generate(long_prompts[::-1], greedy)] == expected[::-1]
    assert llm.engine.stats().num_prefix_cache_hit_tokens - hits_before >= 3 * WINDOW


def test_chunked_prompts_past_the_window_equal_transformers(gemma3_dir: Path, long_prompts: list[list[int]],
                                                            hf_long_answers: list[HfAnswer]) -> None:
    chunked = LLM(str(gemma3_dir), device="cpu", dtype="float32", max_model_len=2048, kv_cache_blocks=256,
                  max_num_seqs=8, max_num_batched_tokens=200)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    assert [o.token_ids for o in chunked.generate(long_prompts[:2], greedy)] == [a.token_ids
                                                                                 for a in hf_long_answers[:2]]


def test_logits_past_the_window_are_transformers_and_need_the_window(raw_llm: LLM, long_prompts: list[list[int]],
                                                                      hf_long_answers: list[HfAnswer]) -> None:
    """The last position's logits equal transformers' to float32 rounding; with the windows taken off they do not
    (the window is what the long prompts test)."""
    prompt, theirs = long_prompts[1], hf_long_answers[1].first_logits
    runner = raw_llm.engine.runner
    batch = whole_prompt_batch(prompt, raw_llm.engine)
    ours = runner.model.compute_logits(runner._forward(batch)[-1:])[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)
    windows = [layer.variant for layer in runner.layers]
    try:
        for layer in runner.layers:
            layer.variant = PLAIN
        unwindowed = runner.model.compute_logits(runner._forward(batch)[-1:])[0]
    finally:
        for layer, variant in zip(runner.layers, windows, strict=True):
            layer.variant = variant
    assert (unwindowed - theirs).abs().max() > 0.1


@pytest.mark.skipif(load_cpu_kernels(None).int8_dot is None, reason="the int8 dot-product kernels are not built here")
def test_the_packed_decode_steps_agree_with_float32_but_at_near_ties(gemma3_dir: Path, llm: LLM,
                                                                     long_prompts: list[list[int]]) -> None:
    """The path `auto` serves the file with on a CPU (every projection on its GGUF grid through the int8 dot products,
    the layers as the packed decode steps: windows, Gemma's norms, GELU) against the float32 reference: short prompts
    and prompts past the window, their greedy tokens the same but at near-ties (the project's rule)."""
    packed = LLM(str(gemma3_dir), device="cpu", dtype="auto", max_model_len=2048, kv_cache_blocks=256,
                 max_num_seqs=8, max_num_batched_tokens=2048)
    assert packed.engine.runner.cpu_decode is not None  # type: ignore[attr-defined]
    prompts = [llm.tokenizer.encode(text) for text in TEXTS[:2]] + long_prompts
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=5)
    assert_diverge_rarely_near_ties(packed.generate(prompts, params), llm.generate(prompts, params))
