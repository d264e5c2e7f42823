"""The sampler's row chunks on CUDA (gpu/sampler.py `row_chunks`): the same tokens and logprobs as one pass, on the
torch path and the fused path's redraw, and the warm-up's heaviest sampling step's peak memory, which sizes the KV
cache, bounded by the chunk size rather than the batch.

At 256 rows of a 151,936-token vocabulary (the default max_num_seqs, Qwen3's vocabulary) each chunk's cumsum runs
with the thread layout of the whole batch's (ATen picks it from the row count), so the floats are the one pass's
bit for bit.
"""

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the fused sampling path needs CUDA", allow_module_level=True)

from gpu.batch import Penalties, RowSampling, TokenMask  # noqa: E402
from gpu.penalties import PenaltyState  # noqa: E402
from gpu.pending_step import SampledRows  # noqa: E402
from gpu.sampler import SAMPLING_CHUNK_BYTES, Sampler  # noqa: E402
from tests.unit.test_sampler_chunks import KINDS, ONE_PASS  # noqa: E402

CUDA = torch.device("cuda")
VOCAB = 151936
NUM_ROWS = 256


def heaviest_rows(num_rows: int) -> list[RowSampling]:
    """The warm-up's (gpu/model_runner.py `_warm_up`)."""
    return [RowSampling(temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, num_top_logprobs=20,
                        penalties=Penalties(slot=i, presence=0.5, frequency=0.5, repetition=1.2))
            for i in range(num_rows)]


def every_token(num_rows: int) -> TokenMask:
    return TokenMask(list(range(num_rows)), np.full((num_rows, -(-VOCAB // 32)), -1, np.int32))


def bf16_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    return (3 * torch.randn(num_rows, VOCAB, device=CUDA, generator=generator)).bfloat16()  # bf16 rows do tie


def sampler(max_chunk_bytes: int) -> Sampler:
    return Sampler(CUDA, 42, penalty_state=PenaltyState(NUM_ROWS, VOCAB, CUDA), max_chunk_bytes=max_chunk_bytes)


def assert_same(a: SampledRows, b: SampledRows) -> None:
    assert torch.equal(a.token_ids, b.token_ids)
    assert (a.packed_logprobs is None) == (b.packed_logprobs is None)
    if a.packed_logprobs is not None:
        assert torch.equal(a.packed_logprobs, b.packed_logprobs)


@pytest.mark.parametrize("batch", ["mixed", "filtered", "heaviest"])
def test_chunks_draw_the_tokens_and_logprobs_of_one_pass(batch: str) -> None:
    """mixed: the fused kernel draws the plain rows and the torch path redraws the filtered ones through an index;
    filtered: the torch path draws every row; heaviest: the warm-up's step, penalties and token masks included."""
    logits = bf16_logits(NUM_ROWS)
    rows = {"mixed": [KINDS[i % len(KINDS)] for i in range(NUM_ROWS)],
            "filtered": [KINDS[1 + 4 * (i % 2)] for i in range(NUM_ROWS)],
            "heaviest": heaviest_rows(NUM_ROWS)}[batch]
    mask = every_token(NUM_ROWS) if batch == "heaviest" else None
    chunked, one_pass = sampler(SAMPLING_CHUNK_BYTES), sampler(ONE_PASS)
    for _ in range(2):  # the second step: the generators moved on alike
        assert_same(chunked.sample(logits, rows, token_mask=mask), one_pass.sample(logits, rows, token_mask=mask))


def test_the_heaviest_sampling_steps_peak_is_bounded_by_the_chunk() -> None:
    """Beyond its input, the warm-up's step holds the penalized float32 copy and the noise ([rows, vocab] each) and
    one chunk's work; in one pass the work is as large as the batch."""
    logits = bf16_logits(NUM_ROWS)
    peaks = {}
    for name, max_chunk_bytes in (("chunked", SAMPLING_CHUNK_BYTES), ("one pass", ONE_PASS)):
        s = sampler(max_chunk_bytes)
        s(logits, heaviest_rows(NUM_ROWS), token_mask=every_token(NUM_ROWS))  # compiles the kernels first
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        s(logits, heaviest_rows(NUM_ROWS), token_mask=every_token(NUM_ROWS))
        peaks[name] = torch.cuda.max_memory_allocated() - before
    print({name: f"{peak / 2**20:.0f} MiB" for name, peak in peaks.items()})
    batch_blocks = 2 * NUM_ROWS * VOCAB * 4
    # A chunk's sort holds about twelve of its float32 blocks at once (gpu/sampler.py's SAMPLING_CHUNK_BYTES).
    assert peaks["chunked"] < batch_blocks + 16 * SAMPLING_CHUNK_BYTES < peaks["one pass"]
