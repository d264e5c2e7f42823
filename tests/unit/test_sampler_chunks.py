"""The torch sampling path in row chunks: the same tokens and logprobs as in one pass, and a peak memory that does
not grow with the batch beyond the one noise block (measured from the CPU allocator's events under torch.profiler)."""

from collections.abc import Callable

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from gpu.batch import RowSampling
from gpu.pending_step import SampledRows
from gpu.sampler import Sampler, row_chunks

CPU = torch.device("cpu")
VOCAB = 4096
ROWS_PER_CHUNK = 3
CHUNK_BYTES = ROWS_PER_CHUNK * VOCAB * 4
ONE_PASS = 2**40  # bytes: every batch here is one chunk

KINDS = [
    RowSampling(temperature=0.0, num_top_logprobs=3),
    RowSampling(temperature=0.8, top_p=0.9, seed=7, output_index=3, num_top_logprobs=20),
    RowSampling(temperature=1.0),
    RowSampling(temperature=0.7, top_k=40, banned_token_ids=(1, 2)),
    RowSampling(temperature=1.1, min_p=0.05, seed=11),
    RowSampling(temperature=0.9, top_p=0.5, top_k=100, num_top_logprobs=5),
    RowSampling(temperature=0.0, top_k=5),
]
FILTERED = RowSampling(temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, num_top_logprobs=20)


def mixed_rows(num_rows: int) -> list[RowSampling]:
    return [KINDS[i % len(KINDS)] for i in range(num_rows)]


def random_logits(num_rows: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # Rounded to a coarse grid: many ties, which the sort and top-k must break the same way in every chunk.
    generator = torch.Generator().manual_seed(num_rows)
    return (torch.randn(num_rows, VOCAB, generator=generator) * 3).mul(8).round().div(8).to(dtype)


def steps(sampler: Sampler, logits: torch.Tensor, rows: list[RowSampling], num_steps: int = 2) -> list[SampledRows]:
    return [sampler.sample(logits, rows) for _ in range(num_steps)]  # the second step: the stream moved on alike


def peak_bytes(work: Callable[[], object]) -> int:
    """The most bytes `work` holds allocated at once beyond what existed before it, from the allocator's events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def test_row_chunks_cover_the_rows_in_bounded_chunks_of_two_rows_or_more() -> None:
    assert row_chunks(7, 1000, 3 * 4000) == [slice(0, 3), slice(3, 7)]  # a last single row joins the chunk before
    assert row_chunks(9, 1000, 3 * 4000) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    assert row_chunks(5, 1000, 1) == [slice(0, 2), slice(2, 5)]  # two rows even where one is over the bound
    assert row_chunks(1, 1000, 1) == [slice(0, 1)]
    assert row_chunks(256, 151936, 64 * 2**20) == [slice(0, 110), slice(110, 220), slice(220, 256)]
    assert row_chunks(0, 1000, 1) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_rows", [1, 2, 7, 23])
def test_chunks_draw_the_tokens_and_logprobs_of_one_pass(num_rows: int, dtype: torch.dtype) -> None:
    logits = random_logits(num_rows, dtype)
    rows = mixed_rows(num_rows)
    chunked = steps(Sampler(CPU, 5, max_chunk_bytes=CHUNK_BYTES), logits, rows)
    one_pass = steps(Sampler(CPU, 5, max_chunk_bytes=ONE_PASS), logits, rows)
    for a, b in zip(chunked, one_pass, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert a.packed_logprobs is not None and b.packed_logprobs is not None
        assert torch.equal(a.packed_logprobs, b.packed_logprobs)
    if num_rows > 2:  # with a plain random row
        assert not torch.equal(chunked[0].token_ids, chunked[1].token_ids), "the unseeded rows drew anew"


def test_rows_drawn_through_an_index_are_drawn_as_those_rows_alone() -> None:
    """The CUDA path's redraw of its filtered rows gathers them chunk by chunk from the whole batch's logits."""
    logits = random_logits(20, torch.bfloat16)
    where = torch.tensor([1, 3, 4, 8, 9, 10, 15, 19])
    rows = [FILTERED if i % 2 else KINDS[1] for i in range(len(where))]
    through_index = Sampler(CPU, 3, max_chunk_bytes=CHUNK_BYTES)._torch_token_ids(logits, rows, where)
    alone = Sampler(CPU, 3, max_chunk_bytes=ONE_PASS)._torch_token_ids(logits[where].float(), rows)
    assert torch.equal(through_index, alone)


@pytest.mark.parametrize("num_rows", [4 * ROWS_PER_CHUNK, 40 * ROWS_PER_CHUNK])
def test_peak_memory_beyond_the_noise_does_not_grow_with_the_rows(num_rows: int) -> None:
    """In one pass every filtered row holds about seven float32 [rows, vocab] blocks at once; in chunks only the
    noise (one such block, drawn at once to keep the generator's stream) grows with the batch."""
    logits = random_logits(num_rows)
    sampler = Sampler(CPU, 0, max_chunk_bytes=CHUNK_BYTES)
    beyond_noise = peak_bytes(lambda: sampler.sample(logits, [FILTERED] * num_rows)) - num_rows * VOCAB * 4
    assert beyond_noise < 8 * CHUNK_BYTES, beyond_noise / CHUNK_BYTES
