"""Sampling inside the decode graphs (gpu/cuda_graphs.py's sampling head) draws what the eager sampler draws.

Two runners on one tiny bf16 Qwen3 checkpoint, fed the same decode steps: the decode graphs with the logits and the
fused kernel's draw inside, and the same with graphs off (the head run eagerly on the padded buffers). Their tokens
and logprobs must be equal step by step: greedy rows, seeded and unseeded random rows (the engine's seed fixes the
unseeded keys), top-p/top-k rows (drawn again by the torch path), logprobs, a logit-bias row (the eager path, from
the graph's logits) and batch sizes that pad their bucket. The in-graph runner must not call the eager sampler on
the plain steps. And on the same logits, the head's draw (`graph_draw`, the kernel, `finish_graph_draw`) gives what
the eager sampler's `sample` gives, from a sampler seeded alike, so a row draws the same tokens whichever its step
takes.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from core.config import engine_config
from core.engine import runner_config
from gpu.batch import Batch, LogitBias, RowSampling
from gpu.model_runner import ModelRunner
from gpu.pending_step import PendingStep
from gpu.sampler import Sampler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("triton")

BLOCK = 16
BLOCKS_PER_ROW = 4


def make_runner(model_dir: Path, eager: bool) -> ModelRunner:
    return ModelRunner(runner_config(engine_config(
        str(model_dir), dtype="bfloat16", device="cuda", block_size=BLOCK, kv_cache_blocks=16 * BLOCKS_PER_ROW + 8,
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=BLOCK * BLOCKS_PER_ROW, enforce_eager=eager,
        attention_backend="triton", seed=11,
    )))


def decode_step(rows: list[RowSampling], step: int) -> Batch:
    """Row i on blocks [4i, 4i + 4), its context growing by one token a step (K/V written as it goes)."""
    n, context = len(rows), 20 + step
    tables = [list(range(BLOCKS_PER_ROW * i, BLOCKS_PER_ROW * (i + 1))) for i in range(n)]
    position = context - 1
    return Batch(
        token_ids=[(13 * i + 7 * step) % 500 for i in range(n)], positions=[position] * n,
        slot_mapping=[t[position // BLOCK] * BLOCK + position % BLOCK for t in tables],
        query_lens=[1] * n, context_lens=[context] * n, block_tables=tables, sampling=rows,
    )


def plain_steps(step: int) -> list[list[RowSampling]]:
    return [
        [RowSampling(temperature=0.0)] * 4,
        [RowSampling(temperature=0.8), RowSampling(temperature=0.0),
         RowSampling(temperature=1.0, seed=5, output_index=step)],  # 3 rows in the bucket of 4
        [RowSampling(temperature=0.7, top_p=0.9), RowSampling(temperature=0.9),
         RowSampling(temperature=0.0, num_top_logprobs=3), RowSampling(temperature=1.2, num_top_logprobs=2)],
        [RowSampling(temperature=0.8, top_k=5)] * 2,  # every row filtered: the torch path alone
        [RowSampling(temperature=0.5 + 0.05 * i, seed=i if i % 2 else None, output_index=step) for i in range(16)],
    ]


def biased_step() -> list[RowSampling]:
    bias = LogitBias(np.array([5, 6], dtype=np.int64), np.array([5.0, -5.0], dtype=np.float32))
    return [RowSampling(temperature=0.0), RowSampling(temperature=0.9, logit_bias=bias)]


def test_in_graph_draws_equal_the_eager_sampler(tiny_model_dirs: dict[str, Path]) -> None:
    model_dir = tiny_model_dirs["qwen3"]
    in_graph = make_runner(model_dir, eager=False)
    assert in_graph.decode is not None and in_graph.decode.samples and in_graph.decode.graphs
    runners = {"in graph": in_graph, "head eager": make_runner(model_dir, eager=True)}
    eager_calls: list[int] = []
    sample = in_graph.sampler.sample

    def counting_sample(*args: object, **kwargs: object) -> object:
        eager_calls.append(1)
        return sample(*args, **kwargs)  # type: ignore[arg-type]

    in_graph.sampler.sample = counting_sample  # type: ignore[method-assign]
    for step in range(6):
        for rows in plain_steps(step):
            results = {name: r.execute(decode_step(rows, step)) for name, r in runners.items()}
            for name, result in results.items():
                assert result.token_ids == results["in graph"].token_ids, f"step {step}, {len(rows)} rows: {name}"
                assert result.logprobs == results["in graph"].logprobs, f"step {step}, {len(rows)} rows: {name}"
    assert not eager_calls, "plain steps went through the eager sampler"
    results = {name: r.execute(decode_step(biased_step(), 6)) for name, r in runners.items()}
    assert len({tuple(r.token_ids) for r in results.values()}) == 1
    assert eager_calls == [1]  # the biased step: the eager path, from the graph's logits


def test_the_heads_draw_equals_the_eager_samplers() -> None:
    """On the same logits, step after step: a sampler drawing as a decode graph's head does and one sampling
    eagerly, seeded alike, give the same tokens and logprobs (the keys drawn alike, the filtered rows redrawn)."""
    from gpu.kernels.sampling import sample_tokens

    device, vocab = torch.device("cuda"), 1000
    as_head, eager = Sampler(device, seed=11), Sampler(device, seed=11)
    generator = torch.Generator(device=device).manual_seed(0)
    for step in range(3):
        for rows in plain_steps(step):
            logits = (torch.randn(len(rows), vocab, device=device, generator=generator) * 3).to(torch.bfloat16)
            draw = as_head.graph_draw(rows, vocab)
            assert draw is not None
            keys = torch.from_numpy(draw.keys).to(device)
            temperatures = torch.from_numpy(draw.temperatures).to(device)
            drawn = sample_tokens(logits, keys, temperatures, use_pdl=True)
            by_head = PendingStep(as_head.finish_graph_draw(logits, drawn, rows, draw)).result()
            by_eager = PendingStep(eager.sample(logits, rows)).result()
            assert by_head.token_ids == by_eager.token_ids, f"step {step}, {len(rows)} rows"
            assert by_head.logprobs == by_eager.logprobs, f"step {step}, {len(rows)} rows"
