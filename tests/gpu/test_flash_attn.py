"""The flash-attn backend (FlashAttention-4, `flash_attn.cute`) against the torch reference, on CUDA.

The same cases as the Triton kernels' (tests/gpu/test_kernels.py: random caches, shuffled block
tables wider than needed, partly filled last blocks, NaN-poisoned outputs, mixed batches of prefill
chunks, prefix hits and decode rows), through the backend's `forward` as the model calls it.
Skips without CUDA or without flash_attn.cute.
"""

import itertools
import random

import pytest
import torch

from gpu.attention.metadata import AttentionMetadata
from tests.gpu.test_kernels import (  # skips this module too without CUDA or triton
    DECODE_CASES,
    DEVICE,
    PREFILL_CASES,
    PagedBatch,
    Shape,
    assert_matches,
    make_batch,
    random_context_lens,
    reference_attention,
)

pytest.importorskip("flash_attn.cute")

from flash_attn.cute import interface as fa4  # noqa: E402
from flash_attn.cute.cache_utils import get_jit_cache  # noqa: E402
from flash_attn.cute.interface import BIN_BATCH_SEARCH_THRESH  # noqa: E402

from gpu.attention.flash_backend import FlashAttnBackend  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402

BACKEND = FlashAttnBackend()


def attend(b: PagedBatch, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Into a NaN-poisoned output: an element the kernel never wrote fails the comparison."""
    out = torch.full_like(b.query, float("nan"))
    return BACKEND.attend(b.query, b.k_cache, b.v_cache, meta, scale, out)


def metadata(b: PagedBatch, query_lens: list[int], context_lens: list[int]) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.full((b.query.shape[0],), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=b.query_start_loc, context_lens=b.context_lens, block_tables=b.block_tables,
        max_query_len=max(query_lens), max_context_len=max(context_lens),
        is_decode_only=max(query_lens) == 1,
    )


@pytest.mark.parametrize(("shape", "batch", "max_context"), DECODE_CASES, ids=str)
def test_decode_matches_reference(shape: Shape, batch: int, max_context: int) -> None:
    rng = random.Random(hash((shape, batch, max_context)) % 2**32)
    lens = random_context_lens(rng, batch, max_context)
    b = make_batch([1] * batch, lens, shape)
    scale = shape.head_dim**-0.5
    out = attend(b, metadata(b, [1] * batch, lens), scale)
    assert_matches(out, b.reference(scale), f"fa4 decode {shape} batch={batch} max_ctx={max_context}")


@pytest.mark.parametrize(("shape", "rows"), PREFILL_CASES, ids=lambda x: str(x)[:60])
def test_prefill_and_mixed_match_reference(shape: Shape, rows: list[tuple[int, int]]) -> None:
    query_lens, context_lens = [q for q, _ in rows], [c for _, c in rows]
    b = make_batch(query_lens, context_lens, shape)
    scale = shape.head_dim**-0.5
    meta = metadata(b, query_lens, context_lens)
    meta.is_decode_only = False  # a batch of single-token rows may still come as a mixed step
    out = attend(b, meta, scale)
    assert_matches(out, b.reference(scale), f"fa4 prefill {shape} rows={len(rows)} tokens={sum(query_lens)}")


def test_float16() -> None:
    lens = [70, 1, 300]
    b = make_batch([70, 1, 33], lens, Shape(16, 128, 2, 8), dtype=torch.float16)
    out = attend(b, metadata(b, [70, 1, 33], lens), 0.1)
    assert_matches(out, b.reference(0.1), "fa4 prefill float16")


def test_decode_replays_in_a_cuda_graph_with_new_lengths() -> None:
    """Captured once; lengths, tables and queries change in place between replays."""
    shape, batch = Shape(16, 128, 2, 8), 32
    first = make_batch([1] * batch, [4096] * batch, shape)
    static_q, static_lens, static_tables = first.query.clone(), first.context_lens.clone(), first.block_tables.clone()
    meta = metadata(first, [1] * batch, [4096] * batch)
    meta.context_lens, meta.block_tables = static_lens, static_tables
    graph, static_out = captured(lambda: BACKEND.forward(static_q, first.k_cache, first.v_cache, meta, 0.09))
    rng = random.Random(7)
    for step in range(3):
        lens = random_context_lens(rng, batch, 4096 if step else 300)
        static_q.copy_(torch.randn_like(static_q.float()).to(static_q.dtype))
        static_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        static_tables.copy_(static_tables[torch.randperm(batch, device=DEVICE)])
        static_out.fill_(float("nan"))
        graph.replay()
        ref = reference_attention(
            static_q, first.k_cache, first.v_cache, first.query_start_loc, static_lens, static_tables, 0.09
        )
        assert_matches(static_out, ref, f"fa4 decode graph replay {step}")


@pytest.mark.parametrize(("bucket", "capacity"), [(64, 64), (512, 64), (2048, 300)])
def test_steps_with_prefill_replay_in_a_padded_cuda_graph(bucket: int, capacity: int) -> None:
    """As gpu/mixed_graphs.py runs them: captured once for a token bucket and a row capacity (max_seqlen_q the
    bucket), then replayed for different mixes of fresh prompts, prefix hits and decode rows written in place,
    with padding rows that have no queries and no context. Checks FA4's grid does not depend on the lengths.
    The capacities cover both sides of FA4's batch-lookup threshold (BIN_BATCH_SEARCH_THRESH rows)."""
    shape = Shape(16, 128, 2, 8)
    num_heads, width, num_blocks = shape.num_kv_heads * shape.group, 4096 // 16 + 1, 2048
    cache = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache, device=DEVICE).to(torch.bfloat16)
    v_cache = torch.randn(cache, device=DEVICE).to(torch.bfloat16)
    query = torch.zeros(bucket, num_heads, shape.head_dim, device=DEVICE, dtype=torch.bfloat16)
    starts = torch.zeros(capacity + 1, dtype=torch.int32, device=DEVICE)
    lens = torch.zeros(capacity, dtype=torch.int32, device=DEVICE)
    tables = torch.zeros(capacity, width, dtype=torch.int32, device=DEVICE)
    meta = AttentionMetadata(
        slot_mapping=torch.full((bucket,), -1, dtype=torch.int64, device=DEVICE), query_start_loc=starts,
        context_lens=lens, block_tables=tables, max_query_len=bucket, max_context_len=4096, is_decode_only=False,
    )
    rng = random.Random(bucket)

    def write_step() -> int:
        """A random step of at most `bucket` tokens and `capacity` rows into the static inputs; its row count."""
        rows: list[tuple[int, int]] = []
        tokens = 0
        while len(rows) < capacity and tokens < bucket:
            kind = rng.choice(["fresh", "hit", "decode", "decode"])
            new = 1 if kind == "decode" else rng.randint(1, min(bucket - tokens, 700))
            prefix = 0 if kind == "fresh" else rng.randint(1, 4096 - new)
            rows.append((new, prefix + new))
            tokens += new
        query_lens = [q for q, _ in rows] + [0] * (capacity - len(rows))
        context_lens = [c for _, c in rows] + [0] * (capacity - len(rows))
        table_rows = []  # random blocks, shared between rows as prefix-cache hits share them
        for n in context_lens:
            need = -(-n // shape.block_size)
            table_rows.append([rng.randrange(num_blocks) for _ in range(need)] + [0] * (width - need))
        starts.copy_(torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32))
        lens.copy_(torch.tensor(context_lens, dtype=torch.int32))
        tables.copy_(torch.tensor(table_rows, dtype=torch.int32))
        query.copy_(torch.randn(query.shape, device=DEVICE).to(query.dtype))
        return len(rows)

    write_step()
    graph, static_out = captured(lambda: BACKEND.forward(query, k_cache, v_cache, meta, 0.09))
    for step in range(3):
        num_rows = write_step()
        num_tokens = int(starts[num_rows].item())
        static_out.fill_(float("nan"))
        graph.replay()
        ref = reference_attention(
            query[:num_tokens], k_cache, v_cache, starts[: num_rows + 1], lens[:num_rows], tables[:num_rows], 0.09
        )
        assert_matches(static_out[:num_tokens], ref, f"fa4 padded step graph bucket={bucket} replay {step}")


# FA4's compile caches that our steps reach: its forward, and the helpers of its batch-lookup aid (more rows than
# BIN_BATCH_SEARCH_THRESH).
FA4_COMPILED = {"fwd": fa4._flash_attn_fwd, "tile_cumsum": fa4._compute_tile_cumsum,
                "blocks_to_batch": fa4._compute_blocks_to_batch}
# A step of each kind the scheduler makes: (query lengths, context lengths).
STEPS = {
    "decode": ([1] * 5, [1000, 17, 1, 300, 64]),
    "mixed, longest query within one tile": ([1, 3, 1, 17], [500, 40, 2, 17]),
    "prefill past one tile": ([300, 1], [700, 50]),
    "more rows than the lookup threshold": ([1] * 270 + [40], [30] * 270 + [100]),
}


@pytest.fixture
def fresh_compile_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty in-memory compile caches, as a new server process starts with (still backed by FA4's disk cache)."""
    for name, function in FA4_COMPILED.items():
        monkeypatch.setattr(function, "compile_cache", get_jit_cache(name))


def compiled() -> dict[str, set[object]]:
    return {name: set(function.compile_cache.cache) for name, function in FA4_COMPILED.items()}


def step_on(k_cache: torch.Tensor, v_cache: torch.Tensor, query_lens: list[int], context_lens: list[int],
            rng: random.Random) -> PagedBatch:
    """A step over the given caches (as a server's steps share the layer's cache): random blocks per row."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    width = max(-(-n // block_size) for n in context_lens) + 1
    tables = [[rng.randrange(num_blocks) for _ in range(width)] for _ in context_lens]
    num_heads = num_kv_heads * 2  # the group of the test's shape
    return PagedBatch(
        query=torch.randn(sum(query_lens), num_heads, head_dim, device=DEVICE).to(k_cache.dtype),
        k_cache=k_cache, v_cache=v_cache,
        query_start_loc=torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32, device=DEVICE),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=DEVICE),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE),
    )


def start_like_a_server(max_num_seqs: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, set[object]]]:
    """A layer's cache, with compile_variants run on it as the model runner runs it at start; what is compiled."""
    shape = Shape(16, 128, 2, 8)
    cache_shape = (512, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, device=DEVICE).to(torch.bfloat16)
    v_cache = torch.randn(cache_shape, device=DEVICE).to(torch.bfloat16)
    BACKEND.compile_variants(shape.num_kv_heads * shape.group, k_cache, v_cache, 0.1, max_num_seqs=max_num_seqs)
    return k_cache, v_cache, compiled()


@pytest.mark.usefixtures("fresh_compile_caches")
def test_compile_variants_runs_every_variant() -> None:
    """After compile_variants, a step of every kind our scheduler makes finds its kernels compiled: none compiles
    another (seconds of a running server's time), and each computes what the reference does."""
    k_cache, v_cache, at_start = start_like_a_server(max_num_seqs=300)
    assert at_start["fwd"]
    rng = random.Random(0)
    for label, (query_lens, context_lens) in STEPS.items():
        b = step_on(k_cache, v_cache, query_lens, context_lens, rng)
        out = attend(b, metadata(b, query_lens, context_lens), 0.1)
        assert_matches(out, b.reference(0.1), f"fa4 after compile_variants: {label}")
        assert compiled() == at_start, f"a step ({label}) compiled a variant compile_variants did not"


@pytest.mark.usefixtures("fresh_compile_caches")
def test_a_variant_compile_variants_skips_is_compiled_by_the_step_that_needs_it() -> None:
    """The check above can see a missed variant: with at most BIN_BATCH_SEARCH_THRESH rows a step, compile_variants
    leaves the lookup aid's variant out, and a step with more rows compiles it."""
    k_cache, v_cache, at_start = start_like_a_server(max_num_seqs=BIN_BATCH_SEARCH_THRESH)
    query_lens, context_lens = STEPS["more rows than the lookup threshold"]
    b = step_on(k_cache, v_cache, query_lens, context_lens, random.Random(1))
    attend(b, metadata(b, query_lens, context_lens), 0.1)
    assert compiled()["fwd"] > at_start["fwd"]
