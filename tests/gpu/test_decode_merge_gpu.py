"""The split decode attention kernel that merges its own splits (gpu/kernels/decode_attention.py: the last program
of each (row, KV head) to arrive on its counter merges), on CUDA in bf16 at Qwen3-30B-A3B's and gpt-oss's head
shapes: bit for bit what the separate merge kernel it replaced (tests/decode_merge_reference.py) makes of the same
partials, with and without PDL, eagerly, back to back (each launch's partials differ from the last one's, so a merge
that read a partial before its program had written it would show), and in CUDA graph replays."""

import random

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu.attention.variant import PLAIN, AttentionVariant  # noqa: E402
from gpu.kernels import decode_attention as decode_module  # noqa: E402
from tests.decode_merge_reference import keep_partials, reference_merge  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402
from tests.gpu.test_kernels import (  # noqa: E402
    DEVICE,
    PagedBatch,
    Shape,
    assert_matches,
    make_batch,
    reference_attention,
)

QWEN3_30B_A3B = Shape(16, 128, 8, 4)  # 32 query heads over 4 KV heads of 128
GPT_OSS = Shape(16, 64, 8, 8)  # 64 query heads over 8 KV heads of 64, with sinks
# One to four rows; lengths inside one block, ending mid-block, on a block edge, over many tiles.
CONTEXTS = [[1], [4097], [77, 2000], [16, 511, 8192, 300]]


def _sinks(shape: Shape) -> torch.Tensor:
    return torch.linspace(-3.0, 4.0, shape.group * shape.num_kv_heads, device=DEVICE)


def _check_launch(out: torch.Tensor, partials: tuple[torch.Tensor, torch.Tensor], b: PagedBatch, scale: float,
                  variant: AttentionVariant, label: str) -> None:
    assert torch.equal(out, reference_merge(*partials, variant.sinks, out)), f"{label}: differs from the merge kernel"
    expected = reference_attention(b.query, b.k_cache, b.v_cache, b.query_start_loc, b.context_lens,
                                   b.block_tables, scale, variant)
    assert_matches(out, expected, label)


@pytest.mark.parametrize("use_pdl", [False, True])
@pytest.mark.parametrize("num_splits", [None, 2, 16, 64])
@pytest.mark.parametrize("contexts", CONTEXTS, ids=str)
@pytest.mark.parametrize("shape", [QWEN3_30B_A3B, GPT_OSS], ids=str)
def test_merged_splits_equal_the_merge_kernel(shape: Shape, contexts: list[int], num_splits: int | None,
                                              use_pdl: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = keep_partials(monkeypatch)
    b = make_batch([1] * len(contexts), contexts, shape, min_width=8192 // shape.block_size)
    variant = AttentionVariant(sinks=_sinks(shape)) if shape == GPT_OSS else PLAIN
    config = decode_module.DecodeConfig(num_splits=num_splits)
    for launch in range(2):  # the second starts from the counters the first left
        out = torch.full_like(b.query, float("nan"))
        decode_module.decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.125,
                                       out=out, config=config, use_pdl=use_pdl, variant=variant)
        if not kept:
            pytest.skip(f"one split for {len(contexts)} rows of {shape}: nothing to merge")
        _check_launch(out, kept[-1], b, 0.125, variant, f"{shape} {contexts} splits={num_splits} launch {launch}")


@pytest.mark.parametrize("use_pdl", [False, True])
def test_back_to_back_launches_each_merge_their_own_partials(use_pdl: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two queries alternate over 200 launches on one stream without a sync: every output is the one its own
    query gives alone."""
    kept = keep_partials(monkeypatch)
    b = make_batch([1], [4000], QWEN3_30B_A3B, min_width=512)
    queries = [b.query, torch.randn_like(b.query.float()).to(b.query.dtype)]
    config = decode_module.DecodeConfig(num_splits=16)
    alone = []
    for query in queries:
        alone.append(decode_module.decode_attention(query, b.k_cache, b.v_cache, b.block_tables, b.context_lens,
                                                    0.125, config=config, use_pdl=use_pdl))
        assert torch.equal(alone[-1], reference_merge(*kept[-1], None, alone[-1]))
    outs = [decode_module.decode_attention(queries[i % 2], b.k_cache, b.v_cache, b.block_tables, b.context_lens,
                                           0.125, config=config, use_pdl=use_pdl) for i in range(200)]
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert torch.equal(out, alone[i % 2]), f"launch {i}"


@pytest.mark.parametrize("use_pdl", [False, True])
@pytest.mark.parametrize("shape", [QWEN3_30B_A3B, GPT_OSS], ids=str)
def test_merged_splits_replay_in_a_cuda_graph(shape: Shape, use_pdl: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured once (batch 1 and 4 at the default split count); lengths and queries change between replays, and
    each replay's output is what the merge kernel makes of that replay's partials."""
    kept = keep_partials(monkeypatch)
    variant = AttentionVariant(sinks=_sinks(shape)) if shape == GPT_OSS else PLAIN
    rng = random.Random(7)
    for batch in (1, 4):
        b = make_batch([1] * batch, [4096] * batch, shape, min_width=8192 // shape.block_size)
        graph, static_out = captured(lambda b=b: decode_module.decode_attention(
            b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.125, use_pdl=use_pdl, variant=variant))
        assert kept, f"batch {batch} of {shape}: the default launch does not split"
        graph_partials = kept[-1]
        for replay in range(4):
            lens = [rng.randint(1, 4096) for _ in range(batch)]
            b.context_lens.copy_(torch.tensor(lens, dtype=torch.int32))
            b.query.copy_(torch.randn_like(b.query.float()).to(b.query.dtype))
            static_out.fill_(float("nan"))
            graph.replay()
            _check_launch(static_out, graph_partials, b, 0.125, variant, f"{shape} batch {batch} replay {replay}")
