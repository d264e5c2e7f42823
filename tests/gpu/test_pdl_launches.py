"""Programmatic dependent launches (gpu/kernels/pdl.py) change no number.

Two runners on one tiny bf16 Qwen3 checkpoint, CUDA graphs on, fed the same decode steps (1, 3 and 16 rows, greedy
and seeded random rows, logprobs) and one prefill: one on this GPU, whose kernels launch with PDL, one built and run
as on a GPU without it. Their tokens and logprobs are equal step by step. A kernel that read its predecessor's output
before `griddepcontrol.wait` would race and differ here. Skips where the GPU has no PDL (before Hopper).
"""

from pathlib import Path

import pytest
import torch

from core.config import engine_config
from core.engine import runner_config
from gpu.batch import Batch, RowSampling, StepResult
from gpu.kernels import pdl
from gpu.model_runner import ModelRunner
from tests.gpu.test_sampling_in_graphs import decode_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                reason="needs a CUDA GPU with programmatic dependent launch (Hopper or newer)")
pytest.importorskip("triton")


def prefill(num_tokens: int) -> Batch:
    return Batch(
        token_ids=[(11 * i) % 500 for i in range(num_tokens)], positions=list(range(num_tokens)),
        slot_mapping=[64 * 16 + i for i in range(num_tokens)], query_lens=[num_tokens], context_lens=[num_tokens],
        block_tables=[list(range(64, 64 + -(-num_tokens // 16)))], sampling=[RowSampling(temperature=0.0)],
    )


def test_tokens_with_and_without_pdl_are_equal(tiny_model_dirs: dict[str, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    config = runner_config(engine_config(
        str(tiny_model_dirs["qwen3"]), dtype="bfloat16", device="cuda", block_size=16, kv_cache_blocks=72,
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=64, attention_backend="triton", seed=3,
    ))

    def run() -> list[StepResult]:
        runner = ModelRunner(config)
        results = [runner.execute(prefill(40))]
        for step in range(5):
            for rows in ([RowSampling(temperature=0.0)],
                         [RowSampling(temperature=0.9, seed=7, output_index=step), RowSampling(temperature=0.0),
                          RowSampling(temperature=0.0, num_top_logprobs=2)],
                         [RowSampling(temperature=0.6, seed=i, output_index=step) for i in range(16)]):
                results.append(runner.execute(decode_step(rows, step)))
        return results

    with_pdl = run()
    with monkeypatch.context() as patch:  # as on a GPU without PDL: every kernel, captured or eager, launched plainly
        patch.setattr(pdl, "_supports_pdl", lambda device_index: False)
        without = run()
    assert len(with_pdl) == len(without) == 16
    for i, (a, b) in enumerate(zip(with_pdl, without, strict=True)):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs, f"step {i}"
