"""Random quantized checkpoints (bench/bench_model.py): each format's projections load into our model and run, and
the roofline reads them at their stored width."""

from pathlib import Path

import pytest
import torch

from bench.bench_model import QUANTIZATIONS, SHAPES, build_random_checkpoint
from bench.roofline import ModelShape
from core import LLM, SamplingParams

SHAPE = dict(SHAPES["tiny"], hidden_size=256, intermediate_size=512, head_dim=64)


@pytest.mark.parametrize("quantization", list(QUANTIZATIONS))
def test_random_quantized_checkpoints_run_and_read_smaller(quantization: str, tmp_path: Path) -> None:
    plain = build_random_checkpoint(tmp_path / "bf16", SHAPE, torch.bfloat16)
    quantized = build_random_checkpoint(tmp_path / quantization, SHAPE, torch.bfloat16, quantization=quantization)
    llm = LLM(str(quantized), device="cpu", dtype="float32", kv_cache_blocks=16, max_num_seqs=2)
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids) == 4
    plain_bytes, quantized_bytes = (ModelShape.from_dir(d).dense_bytes for d in (plain, quantized))
    hidden, head_dim = 256, 64
    per_layer = 2 * hidden * (SHAPE["num_attention_heads"] + SHAPE["num_key_value_heads"]) * head_dim + 3 * hidden * 512
    projections = 2 * SHAPE["num_hidden_layers"] * per_layer  # their bf16 bytes: q, k, v, o and the MLP
    assert plain_bytes - quantized_bytes > projections * (0.45 if quantization == "fp8" else 0.6)
