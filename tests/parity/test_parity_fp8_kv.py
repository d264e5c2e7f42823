"""An FP8 KV cache (`--kv-cache-dtype fp8`) against transformers, float32 on CPU: our greedy tokens equal those of
transformers with every layer's keys and values rounded as our cache holds them (tests/kv_fp8.py), with scales of
1 and with per-layer scales from the checkpoint; the rounding is real (the tokens of a model whose cache keeps
float32 differ from it)."""

import json
from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from tests.kv_fp8 import fp8_kv_model, with_kv_scales
from tests.parity.test_parity_cpu import model_dir_of, prompts_of_lengths

PROMPTS = prompts_of_lengths((1, 7, 19, 40))
MAX_NEW = 12


def greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize(("model", "scales"), [("qwen3", None), ("llama", None), ("qwen3", (0.01, 0.03))])
def test_greedy_tokens_equal_transformers_with_the_cache_rounded(tiny_model_dirs: dict[str, Path], tmp_path: Path,
                                                                 model: str, scales: tuple[float, float] | None
                                                                 ) -> None:
    model_dir = tiny_model_dirs[model]
    if scales is not None:  # small scales: some of the tiny model's values divided by them pass FP8's largest
        model_dir = with_kv_scales(model_dir, tmp_path / "scaled", [scales, (scales[1], scales[0])])
    llm = LLM(str(model_dir), device="cpu", dtype="float32", kv_cache_dtype="fp8", kv_cache_blocks=64,
              block_size=4, max_num_seqs=4, max_num_batched_tokens=32)
    ours = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))]
    reference = fp8_kv_model(model_dir, torch.float32)
    assert ours == [greedy(reference, p) for p in PROMPTS]
    plain = LLM(str(model_dir), device="cpu", dtype="float32", kv_cache_blocks=64, max_num_seqs=4)
    assert ours != [o.token_ids for o in plain.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))]


def test_pooling_models_refuse_an_fp8_cache(tiny_model_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype fp8 is for generation"):
        LLM(str(tiny_model_dirs["qwen3"]), device="cpu", dtype="float32", task="embed", kv_cache_dtype="fp8")


def test_each_kv_cache_group_reads_its_layers_scales(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Gemma 3's windowed and full-attention layers keep two KV-cache groups, every layer with its own scales: a
    40-token prompt prefilled in chunks (the windowed blocks before the window released) is scored as transformers
    scores it with each layer's keys and values rounded, and not as with float32 ones (its tokens repeat one id, so
    the prompt's log-probabilities are compared rather than its greedy tokens)."""
    model_dir = model_dir_of(tiny_model_dirs, "gemma3")
    scales = [(0.01, 0.03), (0.03, 0.01), (0.02, 0.05)]
    assert json.loads((model_dir / "config.json").read_text())["num_hidden_layers"] == len(scales)
    model_dir = with_kv_scales(model_dir, tmp_path / "scaled", scales)
    prompt = prompts_of_lengths((40,))[0]
    scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    settings = dict(device="cpu", dtype="float32", kv_cache_blocks=64, block_size=4, max_num_seqs=4,
                    max_num_batched_tokens=32)
    llm = LLM(str(model_dir), kv_cache_dtype="fp8", **settings)
    assert len(llm.engine.block_manager.pools) == 2
    ours = [entry.logprob for entry in llm.generate([prompt], scoring)[0].prompt_logprobs[1:]]
    plain = LLM(str(model_dir), **settings)
    unrounded = [entry.logprob for entry in plain.generate([prompt], scoring)[0].prompt_logprobs[1:]]
    with torch.no_grad():
        logits = fp8_kv_model(model_dir, torch.float32)(torch.tensor([prompt])).logits[0, :-1]
    reference = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(ours), reference, rtol=0, atol=1e-4)
    assert (torch.tensor(unrounded) - reference).abs().max() > 1e-2
