"""A verifying step's attention as decode rows (AttentionMetadata.query_rows: each query its own row, context its
position + 1) through the Triton backend's decode kernel, on CUDA: the prefill kernel's output for the same step,
at served models' head shapes, with a layer's variant, from an FP8 cache, and in a CUDA graph behind the kernel that
stores the step's K/V (whose launch may let the next start early: the step's slots are poisoned before every replay).
The interpreter's cases: tests/unit/verify_attention_interpreted_cases.py."""

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu.attention.metadata import AttentionMetadata, query_rows_of_uniform_rows  # noqa: E402
from gpu.attention.triton_backend import TritonBackend  # noqa: E402
from gpu.attention.variant import PLAIN, AttentionVariant  # noqa: E402
from gpu.kernels.prefill_attention import prefill_attention  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402
from tests.gpu.test_attention_variant_kernels import GEMMA3, GPT_OSS, poison_before_windows  # noqa: E402
from tests.gpu.test_kernels import DEVICE, PagedBatch, Shape, assert_matches, make_batch  # noqa: E402

SMOLLM2 = Shape(16, 64, 3, 3)  # SmolLM2-135M: 9 query heads over 3 KV heads of 64
QWEN3 = Shape(16, 128, 4, 8)  # Qwen3-8B: 32 query heads over 8 KV heads of 128
# (k + 1, context lengths): rows of one verifying step, contexts from one block to thousands of tokens
STEPS = [(5, [300]), (2, [17, 513]), (9, [9, 4096, 700]), (5, [65] * 16 + [1000] * 16)]


def _positions(context_lens: torch.Tensor, num_queries: int) -> torch.Tensor:
    """[rows, num_queries] int64: each row's last num_queries positions."""
    return context_lens[:, None].long() - num_queries + torch.arange(num_queries, device=context_lens.device)


def _meta(b: PagedBatch, num_queries: int) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.full((b.query.shape[0],), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=b.query_start_loc, context_lens=b.context_lens, block_tables=b.block_tables,
        max_query_len=num_queries, max_context_len=int(b.context_lens.max()), is_decode_only=False,
        query_rows=query_rows_of_uniform_rows(_positions(b.context_lens, num_queries), b.block_tables))


def _prefill(b: PagedBatch, scale: float, variant: AttentionVariant = PLAIN) -> torch.Tensor:
    return prefill_attention(b.query, b.k_cache, b.v_cache, b.query_start_loc, b.context_lens, b.block_tables, scale,
                             variant=variant)


def _variants(num_heads: int) -> dict[str, AttentionVariant]:
    sinks = torch.linspace(-3.0, 4.0, num_heads, device=DEVICE)
    return {"plain": PLAIN, "window-128-sinks": AttentionVariant(sliding_window=128, sinks=sinks),
            "softcap-window-300": AttentionVariant(sliding_window=300, softcap=20.0)}


@pytest.mark.parametrize("step", STEPS, ids=str)
@pytest.mark.parametrize("shape", [SMOLLM2, QWEN3, GEMMA3, GPT_OSS], ids=str)
@pytest.mark.parametrize("name", list(_variants(1)))
def test_decode_rows_equal_the_prefill_kernel(shape: Shape, step: tuple[int, list[int]], name: str) -> None:
    num_queries, context_lens = step
    variant = _variants(shape.group * shape.num_kv_heads)[name]
    query_lens = [num_queries] * len(context_lens)
    b = make_batch(query_lens, context_lens, shape)
    poison_before_windows(b, query_lens, variant.sliding_window, float("nan"))
    scale = shape.head_dim**-0.5
    out = TritonBackend().forward(b.query, b.k_cache, b.v_cache, _meta(b, num_queries), scale, variant)
    assert_matches(out, _prefill(b, scale, variant), f"verify {name} {shape} {step}")


def test_decode_rows_read_an_fp8_cache_as_the_prefill_kernel_does() -> None:
    num_queries, context_lens = 5, [300, 1000]
    b = make_batch([num_queries] * 2, context_lens, QWEN3)
    b.k_cache, b.v_cache = b.k_cache.to(torch.float8_e4m3fn), b.v_cache.to(torch.float8_e4m3fn)
    out = TritonBackend().forward(b.query, b.k_cache, b.v_cache, _meta(b, num_queries), 0.088)
    assert_matches(out, _prefill(b, 0.088), "verify fp8 cache")


@pytest.mark.parametrize("lens", [[300], [1088, 37, 4096], [64, 65]], ids=str)
def test_a_captured_step_reads_the_tokens_stored_before_it(lens: list[int]) -> None:
    """The kernel before (q/k norm, rotation and K/V store, launched for PDL) writes the step's k + 1 tokens a row;
    their slots are NaN before every replay of the captured pair, which must read them after that kernel ends. The
    output matches the prefill kernel's over the cache as the replay left it."""
    from gpu.kernels.qk_norm_rope import qk_norm_rope_store_kv

    heads, block_size, width, num_queries = (32, 8, 128), 16, 4096 // 16, 5
    num_heads, num_kv_heads, head_dim = heads
    rows = len(lens)
    k_cache = torch.randn(rows * width, block_size, num_kv_heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(rows * width, device=DEVICE, dtype=torch.int32).view(rows, width).contiguous()
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    positions = _positions(context_lens, num_queries).view(-1)
    blocks = tables.repeat_interleave(num_queries, 0).gather(1, (positions // block_size)[:, None].long()).view(-1)
    slots = blocks.long() * block_size + positions % block_size
    angles = torch.arange(4096, device=DEVICE)[:, None] * torch.rand(head_dim, device=DEVICE)[None, :]
    rotary = (torch.cos(angles).contiguous(), torch.sin(angles).contiguous())
    qkv = torch.empty(rows * num_queries, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE,
                      dtype=torch.bfloat16)
    starts = torch.arange(0, rows * num_queries + 1, num_queries, dtype=torch.int32, device=DEVICE)

    def step() -> torch.Tensor:
        meta = AttentionMetadata(slots, starts, context_lens, tables, num_queries, 4096, False,
                                 query_rows=query_rows_of_uniform_rows(positions.view(rows, -1), tables))
        q = qk_norm_rope_store_kv(qkv, positions, rotary, heads, None, 1e-6, (k_cache, v_cache, slots), use_pdl=True)
        return TritonBackend().forward(q, k_cache, v_cache, meta, 0.088)

    qkv.normal_()
    graph, static_out = captured(step)
    for replay in range(20):
        qkv.normal_()
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = float("nan")
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = float("nan")
        graph.replay()
        q = qk_norm_rope_store_kv(qkv, positions, rotary, heads, None, 1e-6, (k_cache, v_cache, slots))
        plain = prefill_attention(q, k_cache, v_cache, starts, context_lens, tables, 0.088)
        assert not static_out.isnan().any(), f"replay {replay}: a poisoned token of the step was read before its store"
        assert_matches(static_out, plain, f"replay {replay}")
