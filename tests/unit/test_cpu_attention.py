"""The `cpu` attention backend against the torch reference: cache writes and attention over the paged
cache, for decode rows, prefill chunks and both in one step, in float32 and bfloat16."""

import pytest
import torch

from gpu.attention.backend import TorchBackend
from gpu.attention.cpu_backend import CpuBackend
from gpu.attention.metadata import AttentionMetadata

BLOCK_SIZE, NUM_BLOCKS, HEAD_DIM = 4, 32, 16


def _caches(num_kv_heads: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    return (torch.randn(shape, generator=generator).to(dtype), torch.randn(shape, generator=generator).to(dtype))


def _meta(query_lens: list[int], context_lens: list[int]) -> AttentionMetadata:
    """Rows whose blocks are interleaved in the cache (row r of at most 4 uses blocks r, r + 4, r + 8, ...)."""
    max_blocks = -(-max(context_lens) // BLOCK_SIZE)
    tables = torch.tensor([[r + 4 * i for i in range(max_blocks)] for r in range(len(query_lens))], dtype=torch.int32)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.int64), query_start_loc=starts,
                             context_lens=torch.tensor(context_lens, dtype=torch.int32), block_tables=tables,
                             max_query_len=max(query_lens), max_context_len=max(context_lens),
                             is_decode_only=max(query_lens) == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (9, 3), (4, 1)])
@pytest.mark.parametrize(("query_lens", "context_lens"), [
    ([1], [1]), ([1], [23]), ([1, 1, 1], [5, 32, 17]),  # decode steps
    ([7], [7]), ([3, 5], [10, 5]),  # prefill, fresh and after a cached prefix
    ([1, 6, 1, 0], [9, 14, 30, 4]),  # decode rows and a chunk in one step, and a row with nothing to compute
])
def test_attention_equals_the_reference(dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                        query_lens: list[int], context_lens: list[int]) -> None:
    k_cache, v_cache = _caches(num_kv_heads, dtype)
    meta = _meta(query_lens, context_lens)
    query = torch.randn(sum(query_lens), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = TorchBackend().forward(query, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    got = CpuBackend().forward(query, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    rows = [i for i, n in enumerate(query_lens) if n]
    computed = torch.cat([torch.arange(int(meta.query_start_loc[i]), int(meta.query_start_loc[i + 1])) for i in rows])
    # The same float32 math in another summation order: equal to float32 rounding, then rounded to the dtype.
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[computed].float(), expected[computed].float(), rtol=tolerance, atol=tolerance)
    assert got.dtype == dtype


@pytest.mark.parametrize("slots", [[5, 17, 2], [5, -1, 2], [-1, -1, -1], []], ids=str)
def test_store_kv_equals_the_reference(slots: list[int]) -> None:
    """Padding slots (-1) are written nowhere, with or without real slots beside them."""
    key = torch.randn(len(slots), 3, HEAD_DIM)
    value = torch.randn(len(slots), 3, HEAD_DIM)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    expected, got = _caches(3, torch.float32), _caches(3, torch.float32)
    TorchBackend().store_kv(key, value, *expected, slot_mapping)
    CpuBackend().store_kv(key, value, *got, slot_mapping)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if any(s >= 0 for s in slots):
        assert not torch.equal(got[0], _caches(3, torch.float32)[0])  # something was written
