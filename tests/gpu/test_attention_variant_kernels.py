"""Sliding windows, sinks and score soft-caps in the Triton decode and prefill kernels and the flash-attn (FA4)
backend against the torch reference (gpu/attention/torch_ref.py, itself checked against transformers in
tests/unit/test_attention_variants.py), on CUDA, bf16, at the real models' head sizes (Gemma 3: 256; gpt-oss: 64)
and windows (128, 512) over contexts of thousands of tokens, decode and prefill alike, and in CUDA graphs.

A row's block-table entries wholly before its window name a block the kernels must not use: NaN for the Triton
kernels (which read nothing there), large finite values for FA4 (which may read the blocks of the KV tile holding
the window's start and mask them: gpu/attention/variant.py). Either way a kernel that attended there fails.
"""

import random

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu.attention.metadata import AttentionMetadata  # noqa: E402
from gpu.attention.variant import AttentionVariant  # noqa: E402
from gpu.kernels.decode_attention import DecodeConfig, decode_attention  # noqa: E402
from gpu.kernels.prefill_attention import prefill_attention  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402
from tests.gpu.test_kernels import DEVICE, PagedBatch, Shape, assert_matches, make_batch, reference_attention  # noqa: E402

GEMMA3 = Shape(16, 256, 4, 1)  # Gemma 3 270M: 4 query heads over 1 KV head of 256
GPT_OSS = Shape(16, 64, 8, 8)  # gpt-oss-20b: 64 query heads over 8 KV heads of 64


def variants(num_heads: int) -> dict[str, AttentionVariant]:
    sinks = torch.linspace(-3.0, 4.0, num_heads, device=DEVICE)
    return {
        "window-512": AttentionVariant(sliding_window=512),
        "window-128-sinks": AttentionVariant(sliding_window=128, sinks=sinks),
        "sinks": AttentionVariant(sinks=sinks.to(torch.bfloat16)),
        "window-1": AttentionVariant(sliding_window=1),
        "softcap-window-300": AttentionVariant(sliding_window=300, softcap=20.0),
    }


def poison_before_windows(b: PagedBatch, query_lens: list[int], window: int | None, value: float) -> None:
    """Points every table entry wholly before a row's window at a new block filled with `value`."""
    if window is None:
        return
    spare = b.k_cache.shape[0]
    b.k_cache = torch.cat([b.k_cache, torch.full_like(b.k_cache[:1], value)])
    b.v_cache = torch.cat([b.v_cache, torch.full_like(b.v_cache[:1], value)])
    block_size = b.k_cache.shape[1]
    for row, (query_len, context_len) in enumerate(zip(query_lens, b.context_lens.tolist(), strict=True)):
        first_seen = max(0, context_len - query_len - window + 1)
        b.block_tables[row, : first_seen // block_size] = spare


def reference(b: PagedBatch, scale: float, variant: AttentionVariant) -> torch.Tensor:
    return reference_attention(b.query, b.k_cache, b.v_cache, b.query_start_loc, b.context_lens, b.block_tables,
                               scale, variant)


DECODE_LENS = [1, 17, 128, 129, 511, 512, 513, 1000, 4096, 8000]
PREFILL_ROWS = [(700, 700), (1, 3000), (300, 900), (16, 16), (1, 1), (129, 5000), (64, 600)]


@pytest.mark.parametrize("num_splits", [None, 1, 8])
@pytest.mark.parametrize("shape", [GEMMA3, GPT_OSS], ids=str)
@pytest.mark.parametrize("name", list(variants(1)))
def test_decode_with_a_variant(shape: Shape, name: str, num_splits: int | None) -> None:
    variant = variants(shape.group * shape.num_kv_heads)[name]
    b = make_batch([1] * len(DECODE_LENS), DECODE_LENS, shape)
    poison_before_windows(b, [1] * len(DECODE_LENS), variant.sliding_window, float("nan"))
    scale = shape.head_dim**-0.5
    out = torch.full_like(b.query, float("nan"))
    decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, scale, out=out,
                     config=DecodeConfig(num_splits=num_splits), variant=variant)
    assert_matches(out, reference(b, scale, variant), f"decode {name} {shape} splits={num_splits}")


@pytest.mark.parametrize("shape", [GEMMA3, GPT_OSS], ids=str)
@pytest.mark.parametrize("name", list(variants(1)))
def test_prefill_with_a_variant(shape: Shape, name: str) -> None:
    variant = variants(shape.group * shape.num_kv_heads)[name]
    query_lens, context_lens = [q for q, _ in PREFILL_ROWS], [c for _, c in PREFILL_ROWS]
    b = make_batch(query_lens, context_lens, shape)
    poison_before_windows(b, query_lens, variant.sliding_window, float("nan"))
    scale = shape.head_dim**-0.5
    out = torch.full_like(b.query, float("nan"))
    prefill_attention(b.query, b.k_cache, b.v_cache, b.query_start_loc, b.context_lens, b.block_tables, scale,
                      out=out, variant=variant)
    assert_matches(out, reference(b, scale, variant), f"prefill {name} {shape}")


def test_windowed_sink_decode_replays_in_a_cuda_graph() -> None:
    """Captured once with a window and sinks; lengths and queries change between replays."""
    shape, batch = GPT_OSS, 16
    variant = variants(64)["window-128-sinks"]
    b = make_batch([1] * batch, [4096] * batch, shape)
    graph, static_out = captured(lambda: decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables,
                                                          b.context_lens, 0.125, variant=variant))
    rng = random.Random(3)
    for _ in range(3):
        b.context_lens.copy_(torch.tensor([rng.randint(1, 4096) for _ in range(batch)], dtype=torch.int32))
        b.query.copy_(torch.randn_like(b.query.float()).to(b.query.dtype))
        static_out.fill_(float("nan"))
        graph.replay()
        assert_matches(static_out, reference(b, 0.125, variant), "windowed sink decode graph replay")


@pytest.mark.parametrize("is_decode_only", [True, False])
@pytest.mark.parametrize("shape", [GEMMA3, GPT_OSS], ids=str)
@pytest.mark.parametrize("name", list(variants(1)))
def test_flash_attn_with_a_variant(shape: Shape, name: str, is_decode_only: bool) -> None:
    pytest.importorskip("flash_attn.cute")
    from gpu.attention.flash_backend import FlashAttnBackend

    variant = variants(shape.group * shape.num_kv_heads)[name]
    rows = [(1, n) for n in DECODE_LENS] if is_decode_only else PREFILL_ROWS
    query_lens, context_lens = [q for q, _ in rows], [c for _, c in rows]
    b = make_batch(query_lens, context_lens, shape)
    poison_before_windows(b, query_lens, variant.sliding_window, 1e4)
    meta = AttentionMetadata(
        slot_mapping=torch.full((b.query.shape[0],), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=b.query_start_loc, context_lens=b.context_lens, block_tables=b.block_tables,
        max_query_len=max(query_lens), max_context_len=max(context_lens), is_decode_only=is_decode_only)
    scale = shape.head_dim**-0.5
    out = torch.full_like(b.query, float("nan"))
    FlashAttnBackend().attend(b.query, b.k_cache, b.v_cache, meta, scale, out, variant)
    assert_matches(out, reference(b, scale, variant), f"fa4 {name} {shape} decode_only={is_decode_only}")
