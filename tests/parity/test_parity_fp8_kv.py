"""An FP8 KV cache (`--kv-cache-dtype fp8`) against transformers, float32 on CPU: our greedy tokens equal those of
transformers with every layer's keys and values rounded as our cache holds them (tests/kv_fp8.py), with scales of
1 and with per-layer scales from the checkpoint; the rounding is real (the tokens of a model whose cache keeps
float32 differ from it)."""

from pathlib import Path

import pytest
import torch

from core import LLM, SamplingParams
from tests.kv_fp8 import fp8_kv_model, with_kv_scales
from tests.parity.test_parity_cpu import prompts_of_lengths

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
    if scales is not None:  # small scales: the tiny model's keys and values sit near FP8's small end
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
