"""The `cpu` attention backend against the torch reference: cache writes and attention over the paged
cache, plain and within a sliding window, for decode rows, prefill chunks and both in one step, in float32 and
bfloat16; with its C kernels (gpu/cpu_kernels/attention.c) and without. The C kernels' RoPE and cache write
against the attention layer's torch code: the same bits in float32 (without q/k norms)."""

import pytest
import torch
from transformers import Qwen3Config

from gpu.attention.backend import TorchBackend
from gpu.attention.cpu_backend import CpuBackend
from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.cpu_kernels import build, load_cpu_kernels
from gpu.layers.attention import AttentionSpec, DecoderAttention
from gpu.layers.norm import GEMMA3_NORM, LLAMA_NORM, NormConvention
from gpu.layers.rotary import RotaryEmbedding

KERNELS = load_cpu_kernels(None).attention
AVX2_KERNELS = build.load("attention", None, march="haswell").module  # this CPU's narrower code, where it runs
WITH_KERNELS = [pytest.param(None, id="torch")] + [
    pytest.param(kernels, id=name, marks=pytest.mark.skipif(kernels is None, reason="the C kernels are not built here"))
    for name, kernels in (("C", KERNELS), ("C AVX2", AVX2_KERNELS))]

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


WINDOWED = AttentionVariant(sliding_window=6)


@pytest.mark.parametrize("kernels", WITH_KERNELS)
@pytest.mark.parametrize("variant", [PLAIN, WINDOWED], ids=["plain", "window of 6"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (9, 3), (4, 1)])
@pytest.mark.parametrize(("query_lens", "context_lens"), [
    ([1], [1]), ([1], [23]), ([1, 1, 1], [5, 32, 17]),  # decode steps
    ([7], [7]), ([3, 5], [10, 5]),  # prefill, fresh and after a cached prefix
    ([1, 6, 1, 0], [9, 14, 30, 4]),  # decode rows and a chunk in one step, and a row with nothing to compute
])
def test_attention_equals_the_reference(kernels, variant: AttentionVariant, dtype: torch.dtype,  # noqa: ANN001
                                        num_heads: int, num_kv_heads: int, query_lens: list[int],
                                        context_lens: list[int]) -> None:
    """Plain attention, and within a sliding window (decode rows in the C kernel, chunks in the torch code)."""
    k_cache, v_cache = _caches(num_kv_heads, dtype)
    meta = _meta(query_lens, context_lens)
    query = torch.randn(sum(query_lens), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = TorchBackend().forward(query, k_cache, v_cache, meta, HEAD_DIM**-0.5, variant)
    got = CpuBackend(kernels).forward(query, k_cache, v_cache, meta, HEAD_DIM**-0.5, variant)
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


def _attention_layer(dtype: torch.dtype, qk_norm: NormConvention | None) -> DecoderAttention:
    config = Qwen3Config(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=HEAD_DIM,
                         rope_theta=10000.0)
    rotary = RotaryEmbedding(config, HEAD_DIM, 512)
    spec = AttentionSpec(hidden_size=96, num_heads=6, num_kv_heads=2, head_dim=HEAD_DIM, scale=HEAD_DIM**-0.5,
                         qk_norm=qk_norm)
    layer = DecoderAttention(spec, rotary).to(dtype)
    if qk_norm is not None:
        with torch.no_grad():
            layer.q_norm.weight.uniform_(0.5, 1.5)  # type: ignore[union-attr]
            layer.k_norm.weight.uniform_(0.5, 1.5)  # type: ignore[union-attr]
    layer.k_cache, layer.v_cache = (torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 2, HEAD_DIM, dtype=dtype) for _ in range(2))
    return layer


@pytest.mark.skipif(KERNELS is None, reason="the C kernels are not built here")
@pytest.mark.parametrize("qk_norm", [None, LLAMA_NORM, GEMMA3_NORM], ids=["llama", "qwen3 q/k norms", "gemma3's"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rope_and_cache_write_equal_the_layers_torch_code(dtype: torch.dtype, qk_norm: NormConvention | None) -> None:
    """Queries returned, keys and values written to their slots (none for a padding slot -1)."""
    layer = _attention_layer(dtype, qk_norm)
    positions = torch.tensor([0, 5, 300, 17])
    slots = torch.tensor([3, 40, -1, 9], dtype=torch.int64)
    qkv = (torch.randn(4, (6 + 2 * 2) * HEAD_DIM, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    expected_q, expected_k = layer._torch_qk(positions, qkv)
    expected_v = qkv[:, 8 * HEAD_DIM :].view(4, 2, HEAD_DIM)
    layer.cpu_kernels = KERNELS
    got_q = layer._cpu_q_storing_kv(positions, qkv, slots)
    keys, values = layer.k_cache.view(-1, 2, HEAD_DIM), layer.v_cache.view(-1, 2, HEAD_DIM)
    written = [0, 1, 3]
    assert torch.equal(values[slots[written]], expected_v[written])
    if dtype == torch.float32 and qk_norm is None:  # the same operations in the same order
        assert torch.equal(got_q, expected_q) and torch.equal(keys[slots[written]], expected_k[written])
    else:  # the norms' sums in another order; bfloat16 rounded once, not after each operation
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got_q.float(), expected_q.float(), rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(keys[slots[written]].float(), expected_k[written].float(), rtol=tolerance,
                                   atol=tolerance)
    assert int(torch.count_nonzero(keys)) == 3 * 2 * HEAD_DIM  # slot -1 wrote nothing


@pytest.mark.parametrize("kernels", WITH_KERNELS[1:])
@pytest.mark.parametrize("variant", [PLAIN, AttentionVariant(sliding_window=300)], ids=["plain", "window of 300"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_contexts_split_in_chunks_equal_the_reference(kernels, variant: AttentionVariant,  # noqa: ANN001
                                                           dtype: torch.dtype) -> None:
    """Contexts longer than the kernel's chunk of 256 positions are attended to in parts, on every thread, and merged
    (a window's from its first position); a short row beside them is one part."""
    block_size, num_blocks = 16, 160
    generator = torch.Generator().manual_seed(3)
    k_cache, v_cache = (torch.randn(num_blocks, block_size, 2, HEAD_DIM, generator=generator).to(dtype)
                        for _ in range(2))
    context_lens = [1000, 3, 513]
    blocks = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    tables = torch.stack([blocks[:63], blocks[63:126], blocks[126:].repeat(3)[:63]])
    meta = AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.int64),
                             query_start_loc=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
                             context_lens=torch.tensor(context_lens, dtype=torch.int32), block_tables=tables,
                             max_query_len=1, max_context_len=1000, is_decode_only=True)
    query = (torch.randn(3, 6, HEAD_DIM, generator=generator) * 3).to(dtype)
    expected = TorchBackend().forward(query, k_cache, v_cache, meta, HEAD_DIM**-0.5, variant)
    got = CpuBackend(kernels).forward(query, k_cache, v_cache, meta, HEAD_DIM**-0.5, variant)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance, atol=tolerance)
