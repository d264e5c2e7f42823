"""The decode and prefill attention kernels with a layer's variant (sliding window, sinks, soft-cap) run by
Triton's interpreter on the CPU, in float32, against the torch reference (gpu/attention/torch_ref.py, itself
checked against transformers in tests/unit/test_attention_variants.py). A windowed row's table entries before
its window name a block of NaN: a kernel that read one would put NaN in the output. tests/gpu/
test_attention_variant_kernels.py checks the compiled kernels on CUDA."""

import os

import pytest
import torch

from gpu.attention import torch_ref
from gpu.attention.variant import PLAIN, AttentionVariant

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.decode_attention import DecodeConfig, decode_attention  # noqa: E402
from gpu.kernels.prefill_attention import PrefillConfig, prefill_attention  # noqa: E402

BLOCK_SIZE, HEAD_DIM, GROUP, NUM_KV_HEADS = 4, 16, 2, 2
NUM_HEADS = GROUP * NUM_KV_HEADS


def paged_step(query_lens: list[int], context_lens: list[int], window: int | None, seed: int
               ) -> tuple[torch.Tensor, ...]:
    """(query, k_cache, v_cache, query_start_loc, block_tables, context_lens): each row's blocks shuffled over a
    cache whose spare blocks are NaN; entries wholly before a row's earliest window name a NaN block."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_row = [-(-n // BLOCK_SIZE) for n in context_lens]
    num_blocks = sum(blocks_per_row) + 2
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    nan_block = pool[-1]
    caches = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    caches[:, pool[-2:]] = float("nan")
    table = torch.full((len(context_lens), max(blocks_per_row) + 1), nan_block, dtype=torch.int32)
    used = 0
    for row, (query_len, context_len) in enumerate(zip(query_lens, context_lens, strict=True)):
        first_seen = 0 if window is None else max(0, context_len - query_len - window + 1)
        for i in range(blocks_per_row[row]):
            if (i + 1) * BLOCK_SIZE > first_seen:
                table[row, i] = pool[used + i]
        used += blocks_per_row[row]
    query = torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, generator=generator)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return query, caches[0], caches[1], starts, table, torch.tensor(context_lens, dtype=torch.int32)


VARIANTS = {
    "window-6": AttentionVariant(sliding_window=6),
    "window-1": AttentionVariant(sliding_window=1),
    "window-23": AttentionVariant(sliding_window=23),
    "sinks": AttentionVariant(sinks=torch.tensor([-1.0, 0.5, 2.0, 4.0])),
    "window-9-sinks": AttentionVariant(sliding_window=9, sinks=torch.tensor([3.0, -2.0, 0.0, 1.0])),
    "softcap": AttentionVariant(softcap=1.5),
    "window-7-softcap-sinks": AttentionVariant(sliding_window=7, softcap=2.5, sinks=torch.tensor([0.1, 0.2, 0.3, 9.0])),
}


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_decode_kernel_with_a_variant(name: str, num_splits: int) -> None:
    variant = VARIANTS[name]
    lens = [1, 5, 16, 17, 40, 71]
    query, k_cache, v_cache, starts, table, context_lens = paged_step([1] * len(lens), lens, variant.sliding_window,
                                                                      seed=num_splits)
    out = decode_attention(query, k_cache, v_cache, table, context_lens, 0.3,
                           config=DecodeConfig(block_n=16, num_splits=num_splits), variant=variant)
    expected = torch_ref.paged_attention(query, k_cache, v_cache, starts, context_lens, table, 0.3, variant)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_prefill_kernel_with_a_variant(name: str) -> None:
    """Fresh prompts, chunks after a cached prefix and decode rows in one step, over several query tiles (8 queries
    x 2 heads per tile) and 8-token KV tiles, so windows cut tiles in every way."""
    variant = VARIANTS[name]
    query_lens, context_lens = [19, 1, 6, 13, 0], [19, 30, 45, 24, 4]
    query, k_cache, v_cache, starts, table, lens = paged_step(query_lens, context_lens, variant.sliding_window, seed=3)
    out = prefill_attention(query, k_cache, v_cache, starts, lens, table, 0.25,
                            config=PrefillConfig(block_m=16, block_n=8, num_warps=1, num_stages=1), variant=variant)
    expected = torch_ref.paged_attention(query, k_cache, v_cache, starts, lens, table, 0.25, variant)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_plain_prefill_unchanged_by_the_variant_paths() -> None:
    """No variant: the prefill kernel still equals the reference (the plain path's three loops reduce to two)."""
    query, k_cache, v_cache, starts, table, lens = paged_step([10, 3], [10, 35], None, seed=4)
    out = prefill_attention(query, k_cache, v_cache, starts, lens, table, 0.2,
                            config=PrefillConfig(block_m=16, block_n=8, num_warps=1, num_stages=1))
    expected = torch_ref.paged_attention(query, k_cache, v_cache, starts, lens, table, 0.2, PLAIN)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
