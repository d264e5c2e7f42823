"""The Triton kernels against the torch reference (gpu/attention/torch_ref.py), on CUDA.

Skips cleanly without triton or without CUDA. Every case draws fresh random inputs: caches full of
random values, shuffled block tables wider than needed, context lengths that leave the last block
partly filled. Outputs are poisoned with NaN first, so an element the kernel never wrote fails.
Tolerance for bf16: relative Frobenius error under 1e-2 and elementwise atol = rtol = 2e-2 against
the reference's float32 math (rounded to the query dtype by the reference itself).
"""

import itertools
import random
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from gpu.attention import torch_ref  # noqa: E402
from gpu.attention.metadata import AttentionMetadata  # noqa: E402
from gpu.attention.triton_backend import TritonBackend  # noqa: E402
from gpu.kernels.decode_attention import DecodeConfig, decode_attention  # noqa: E402
from gpu.kernels.prefill_attention import prefill_attention  # noqa: E402
from gpu.kernels.store_kv import store_kv  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402

DEVICE = torch.device("cuda")


@dataclass(frozen=True)
class Shape:
    block_size: int
    head_dim: int
    group: int  # query heads per KV head
    num_kv_heads: int


@dataclass
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor  # [num_rows + 1] int32
    context_lens: torch.Tensor  # [num_rows] int32
    block_tables: torch.Tensor  # [num_rows, max_blocks] int32

    def reference(self, scale: float) -> torch.Tensor:
        return reference_attention(
            self.query, self.k_cache, self.v_cache, self.query_start_loc, self.context_lens, self.block_tables, scale
        )


def reference_attention(*args: torch.Tensor | float) -> torch.Tensor:
    """torch_ref.paged_attention on the inputs' device: it builds its causal mask with device-less
    torch.arange, so the default device must be the inputs' one (it is CPU otherwise)."""
    with DEVICE:
        return torch_ref.paged_attention(*args)


def make_batch(
    query_lens: list[int], context_lens: list[int], shape: Shape, dtype: torch.dtype = torch.bfloat16,
    min_width: int = 0,
) -> PagedBatch:
    """Random caches; each row's blocks drawn without replacement from a shuffled pool; tables at least
    min_width blocks wide."""
    blocks_per_row = [-(-n // shape.block_size) for n in context_lens]
    num_blocks = sum(blocks_per_row) + 7  # spare blocks nobody owns
    pool = torch.randperm(num_blocks).tolist()
    width = max(max(blocks_per_row, default=0) + 3, min_width)  # wider than needed, as a graph's static table is
    tables, used = [], 0
    for n in blocks_per_row:
        tables.append(pool[used : used + n] + [0] * (width - n))
        used += n
    cache_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    num_heads = shape.num_kv_heads * shape.group
    starts = [0, *itertools.accumulate(query_lens)]
    return PagedBatch(
        query=torch.randn(starts[-1], num_heads, shape.head_dim, device=DEVICE).to(dtype),
        k_cache=torch.randn(cache_shape, device=DEVICE).to(dtype),
        v_cache=torch.randn(cache_shape, device=DEVICE).to(dtype),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=DEVICE),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE),
    )


def random_context_lens(rng: random.Random, batch: int, max_context: int) -> list[int]:
    """Random lengths in [1, max_context]; the longest and the shortest possible always occur."""
    lens = [rng.randint(1, max_context) for _ in range(batch)]
    lens[0] = max_context
    if batch > 1:
        lens[-1] = 1
    return lens


def assert_matches(out: torch.Tensor, ref: torch.Tensor, label: str, max_rel: float = 1e-2) -> None:
    assert not out.isnan().any(), f"{label}: output elements left unwritten (NaN)"
    diff = (out.float() - ref.float()).abs()
    rel = (diff.norm() / ref.float().norm().clamp_min(1e-30)).item()
    print(f"{label}: rel_err={rel:.2e} max_abs_err={diff.max().item():.2e}")
    assert rel < max_rel, f"{label}: relative error {rel:.3e}"
    tol = 2e-2 if out.dtype in (torch.bfloat16, torch.float16) else 1e-4
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


# (batch, max_context) pairs cycled over the (block_size, head_dim, group) grid.
DECODE_SIZES = [(1, 1), (1, 8192), (3, 17), (7, 1000), (16, 1024), (64, 4096), (256, 1024), (256, 300),
                (33, 2047), (5, 8192), (128, 129), (2, 5000), (1, 1024), (200, 64), (9, 3333), (256, 16)]
KV_HEADS = [8, 4, 2, 1]
DECODE_CASES = [
    (Shape(bs, hd, g, KV_HEADS[i % 4]), *DECODE_SIZES[i])
    for i, (bs, hd, g) in enumerate(itertools.product((16, 32), (64, 128), (1, 2, 4, 8)))
]


@pytest.mark.parametrize(("shape", "batch", "max_context"), DECODE_CASES, ids=str)
def test_decode_matches_reference(shape: Shape, batch: int, max_context: int) -> None:
    rng = random.Random(hash((shape, batch, max_context)) % 2**32)
    lens = random_context_lens(rng, batch, max_context)
    b = make_batch([1] * batch, lens, shape)
    scale = shape.head_dim**-0.5
    out = torch.full_like(b.query, float("nan"))
    decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, scale, out=out)
    assert_matches(out, b.reference(scale), f"decode {shape} batch={batch} max_ctx={max_context}")


@pytest.mark.parametrize("num_splits", [1, 2, 8, 64])
def test_decode_any_split_count(num_splits: int) -> None:
    """Rows shorter than the split count leave empty segments; the merge must ignore them."""
    shape = Shape(16, 128, 2, 8)
    lens = [1, 2, 15, 16, 17, 64, 65, 1000, 4096, 33]
    b = make_batch([1] * len(lens), lens, shape)
    out = torch.full_like(b.query, float("nan"))
    config = DecodeConfig(num_splits=num_splits)
    decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.1, out=out, config=config)
    assert_matches(out, b.reference(0.1), f"decode splits={num_splits}")


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_empty_rows_give_zeros(num_splits: int) -> None:
    """Padding rows of a captured batch have context_len 0: their output is zeros, never NaN."""
    b = make_batch([1] * 3, [40, 7, 1], Shape(16, 64, 4, 2))
    b.context_lens[1] = 0
    out = torch.full_like(b.query, float("nan"))
    config = DecodeConfig(num_splits=num_splits)
    decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.125, out=out, config=config)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert_matches(out[[0, 2]], b.reference(0.125)[[0, 2]], f"decode empty row splits={num_splits}")


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_row_order_changes_only_the_launch_order(num_splits: int) -> None:
    """Rows launched longest first (or in any permutation) give bit-identical outputs in their own places."""
    lens = [5, 3000, 17, 1, 640, 2049, 64, 300]
    b = make_batch([1] * len(lens), lens, Shape(16, 128, 2, 8))
    config = DecodeConfig(num_splits=num_splits)
    plain = decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.1, config=config)
    for order in (sorted(range(len(lens)), key=lambda i: -lens[i]), [3, 0, 7, 1, 6, 2, 5, 4]):
        row_order = torch.tensor(order, dtype=torch.int32, device="cuda")
        out = torch.full_like(b.query, float("nan"))
        decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.1, out=out,
                         config=config, row_order=row_order)
        assert torch.equal(out, plain), f"row order {order}"
    assert_matches(plain, b.reference(0.1), "decode (unordered)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_decode_other_dtypes(dtype: torch.dtype) -> None:
    b = make_batch([1] * 4, [1, 100, 2000, 37], Shape(16, 128, 4, 2), dtype=dtype)
    out = torch.full_like(b.query, float("nan"))
    decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.08, out=out)
    assert_matches(out, b.reference(0.08), f"decode {dtype}", max_rel=1e-2 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_reads_an_fp8_cache(dtype: torch.dtype, num_splits: int) -> None:
    """A 16-bit query over an FP8 cache (its tiles in float16, V converted where loaded): the reference's output over
    the cache's values, at several tile shapes and one query far past float16's range."""
    b = make_batch([1] * 5, [1, 100, 2000, 37, 1024], Shape(16, 128, 4, 2), dtype=dtype)
    b.k_cache, b.v_cache = b.k_cache.to(torch.float8_e4m3fn), b.v_cache.to(torch.float8_e4m3fn)
    expected = reference_attention(b.query.float(), b.k_cache.float(), b.v_cache.float(), b.query_start_loc,
                                   b.context_lens, b.block_tables, 0.08)
    for block_n, num_stages in ((64, None), (128, 2), (32, 3)):
        out = torch.full_like(b.query, float("nan"))
        config = DecodeConfig(block_n=block_n, num_stages=num_stages, num_splits=num_splits)
        decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.08, out=out, config=config)
        assert_matches(out, expected, f"decode fp8 {dtype} {block_n} {num_stages} {num_splits}")
    if dtype == torch.bfloat16:
        huge = decode_attention(b.query * 2.0**20, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.08 / 2**20)
        assert_matches(huge, expected, "decode fp8, a query past float16's range")


def test_decode_replays_in_a_cuda_graph_with_new_lengths() -> None:
    """Captured once; lengths, tables and queries change in place between replays."""
    shape, batch = Shape(16, 128, 2, 8), 32
    first = make_batch([1] * batch, [4096] * batch, shape)  # a pool large enough for every replay
    static_q, static_lens, static_tables = first.query.clone(), first.context_lens.clone(), first.block_tables.clone()
    graph, static_out = captured(
        lambda: decode_attention(static_q, first.k_cache, first.v_cache, static_tables, static_lens, 0.09))
    rng = random.Random(7)
    for step in range(3):
        lens = random_context_lens(rng, batch, 4096 if step else 300)
        static_q.copy_(torch.randn_like(static_q.float()).to(static_q.dtype))
        static_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        static_tables.copy_(static_tables[torch.randperm(batch, device=DEVICE)])  # rows swap their blocks
        static_out.fill_(float("nan"))
        graph.replay()
        ref = reference_attention(
            static_q, first.k_cache, first.v_cache, first.query_start_loc, static_lens, static_tables, 0.09
        )
        assert_matches(static_out, ref, f"decode graph replay {step}")


# Few rows in a table as wide as a decode graph's (max_model_len 8192): the split count, from static shapes, is
# the largest, and most splits have no tile (their programs exit); 0 is a padding row, 1-17 lie around a tile.
FEW_ROW_LENS = [[1024], [4096], [17], [1], [0, 1, 15, 16, 17, 1024, 4096], [8192, 64, 65, 0]]


@pytest.mark.parametrize("lens", FEW_ROW_LENS, ids=str)
def test_decode_few_rows_in_a_graph_wide_table(lens: list[int]) -> None:
    shape = Shape(16, 128, 2, 8)
    b = make_batch([1] * len(lens), [max(n, 1) for n in lens], shape, min_width=8192 // 16)
    b.context_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    out = torch.full_like(b.query, float("nan"))
    row_order = torch.argsort(b.context_lens, descending=True).to(torch.int32)  # as a decode graph launches them
    decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.09, out=out,
                     row_order=row_order)
    assert_decode_matches(out, b, 0.09, f"decode few rows {lens}")


def assert_decode_matches(out: torch.Tensor, b: PagedBatch, scale: float, label: str) -> None:
    """Rows with context 0 all zeros, the others the reference's."""
    is_empty = b.context_lens == 0
    assert torch.equal(out[is_empty], torch.zeros_like(out[is_empty])), f"{label}: an empty row is not zeros"
    if is_empty.all():
        return
    lens = b.context_lens.clamp_min(1)  # the reference's softmax over nothing would be NaN
    ref = reference_attention(b.query, b.k_cache, b.v_cache, b.query_start_loc, lens, b.block_tables, scale)
    assert_matches(out[~is_empty], ref[~is_empty], label)


def test_decode_few_rows_replay_in_a_graph_deterministically() -> None:
    """A few rows in a graph-wide table, captured once with the engine's launch order and replayed with new
    lengths (padding rows of context 0 among them); a replay of the same inputs gives the same bits."""
    shape, batch = Shape(16, 128, 2, 8), 4
    b = make_batch([1] * batch, [4096] * batch, shape, min_width=8192 // 16)
    row_order = torch.arange(batch, dtype=torch.int32, device=DEVICE)

    def run() -> torch.Tensor:
        return decode_attention(b.query, b.k_cache, b.v_cache, b.block_tables, b.context_lens, 0.09,
                                row_order=row_order)

    graph, static_out = captured(run)
    for lens in ([1024, 0, 17, 4096], [15, 4096, 1, 0], [1024, 1024, 1024, 1024], [0, 0, 0, 0]):
        b.context_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        row_order.copy_(torch.argsort(b.context_lens, descending=True).to(torch.int32))
        b.query.copy_(torch.randn_like(b.query.float()).to(b.query.dtype))
        static_out.fill_(float("nan"))
        graph.replay()
        first = static_out.clone()
        for _ in range(3):
            graph.replay()
            assert torch.equal(static_out, first), f"replays of {lens} differ"
        assert_decode_matches(first, b, 0.09, f"decode few rows graph replay {lens}")


# Rows of (query_len, context_len): fresh prefills, prefix-cache hits, chunks, decode rows mixed in.
PREFILL_ROWS = [
    [(1000, 1000)],
    [(17, 17), (64, 64), (1, 1), (300, 300)],
    [(100, 612), (16, 8192), (1, 4000)],
    [(512, 2048), (512, 512)],
    [(1, 1)],
    [(3, 3), (1, 9), (31, 31), (33, 97)],
    [(2048, 8192)],
    [(129, 129), (1, 700), (250, 260)],
]


def mixed_rows(rng: random.Random, num_decode: int) -> list[tuple[int, int]]:
    decodes = [(1, rng.randint(1, 2000)) for _ in range(num_decode)]
    return [(256, 256), *decodes[: num_decode // 2], (128, 3000), *decodes[num_decode // 2 :]]


PREFILL_CASES = [
    (Shape(bs, hd, g, KV_HEADS[i % 4]), PREFILL_ROWS[i % len(PREFILL_ROWS)])
    for i, (bs, hd, g) in enumerate(itertools.product((16, 32), (64, 128), (1, 2, 4, 8)))
]
PREFILL_CASES += [
    (Shape(16, 128, 2, 8), mixed_rows(random.Random(1), 200)),
    (Shape(32, 64, 4, 2), mixed_rows(random.Random(2), 30)),
]


@pytest.mark.parametrize(("shape", "rows"), PREFILL_CASES, ids=lambda x: str(x)[:60])
def test_prefill_matches_reference(shape: Shape, rows: list[tuple[int, int]]) -> None:
    query_lens, context_lens = [q for q, _ in rows], [c for _, c in rows]
    b = make_batch(query_lens, context_lens, shape)
    scale = shape.head_dim**-0.5
    out = torch.full_like(b.query, float("nan"))
    prefill_attention(
        b.query, b.k_cache, b.v_cache, b.query_start_loc, b.context_lens, b.block_tables, scale, out=out
    )
    assert_matches(out, b.reference(scale), f"prefill {shape} rows={len(rows)} tokens={sum(query_lens)}")


def test_prefill_float32() -> None:
    b = make_batch([70, 1, 33], [70, 50, 200], Shape(16, 64, 2, 2), dtype=torch.float32)
    out = torch.full_like(b.query, float("nan"))
    prefill_attention(b.query, b.k_cache, b.v_cache, b.query_start_loc, b.context_lens, b.block_tables, 0.1, out=out)
    assert_matches(out, b.reference(0.1), "prefill float32", max_rel=1e-5)


@pytest.mark.parametrize(
    ("num_tokens", "num_kv_heads", "head_dim", "block_size"),
    [(1, 8, 128, 16), (5, 1, 64, 32), (300, 4, 128, 16), (4096, 8, 64, 16), (77, 2, 96, 32)],
)
def test_store_kv_matches_reference(num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    """Keys and values come as strided views of a fused QKV tensor, as the attention layer makes them."""
    kv_size = num_kv_heads * head_dim
    fused = torch.randn(num_tokens, 3 * kv_size, device=DEVICE).to(torch.bfloat16)
    key = fused[:, kv_size : 2 * kv_size].view(num_tokens, num_kv_heads, head_dim)
    value = fused[:, 2 * kv_size :].view(num_tokens, num_kv_heads, head_dim)
    num_blocks = -(-num_tokens // block_size) * 2 + 1
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[torch.rand(num_tokens, device=DEVICE) < 0.2] = -1  # padding tokens
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=DEVICE).to(torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    torch_ref.store_kv(key, value, k_ref, v_ref, slots)
    store_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("is_decode_only", [True, False])
def test_backend_routes_and_matches_reference(is_decode_only: bool) -> None:
    rows = [(1, 77), (1, 1), (1, 500)] if is_decode_only else [(1, 77), (40, 40), (1, 500), (9, 300)]
    query_lens, context_lens = [q for q, _ in rows], [c for _, c in rows]
    shape = Shape(16, 128, 2, 8)
    b = make_batch(query_lens, context_lens, shape)
    meta = AttentionMetadata(
        slot_mapping=torch.full((b.query.shape[0],), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=b.query_start_loc,
        context_lens=b.context_lens,
        block_tables=b.block_tables,
        max_query_len=max(query_lens),
        max_context_len=max(context_lens),
        is_decode_only=is_decode_only,
    )
    backend = TritonBackend()
    assert backend.name == "triton"
    out = backend.forward(b.query, b.k_cache, b.v_cache, meta, 0.088)
    assert_matches(out, b.reference(0.088), f"backend decode_only={is_decode_only}")


@pytest.mark.parametrize("lens", [[1088], [1088, 37, 1, 4096], [64, 65]], ids=str)
def test_decode_reads_the_own_token_its_pdl_predecessor_stores(lens: list[int]) -> None:
    """Under PDL the split kernel reads its segments' first tiles before waiting on the kernel before; the step's
    own token, which that kernel (q/k norm, rotation and K/V store) writes, must be read after the wait. The own
    slots are poisoned with NaN before every replay of the captured pair; the output equals a plain launch's over
    the cache as the replay left it."""
    from gpu.kernels.qk_norm_rope import qk_norm_rope_store_kv

    heads, block_size, width = (32, 4, 128), 16, 4096 // 16
    num_heads, num_kv_heads, head_dim = heads
    rows = len(lens)
    k_cache = torch.randn(rows * width, block_size, num_kv_heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(rows * width, device=DEVICE, dtype=torch.int32).view(rows, width).contiguous()
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    positions = (context_lens - 1).to(torch.int64)
    own_blocks = tables.gather(1, (positions // block_size).view(-1, 1).to(torch.int64)).view(-1).to(torch.int64)
    slots = own_blocks * block_size + positions % block_size
    angles = torch.arange(4096, device=DEVICE)[:, None] * torch.rand(head_dim, device=DEVICE)[None, :]
    rotary = (torch.cos(angles).contiguous(), torch.sin(angles).contiguous())
    qkv = torch.empty(rows, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE, dtype=torch.bfloat16)

    def step() -> torch.Tensor:
        q = qk_norm_rope_store_kv(qkv, positions, rotary, heads, None, 1e-6, (k_cache, v_cache, slots), use_pdl=True)
        return decode_attention(q, k_cache, v_cache, tables, context_lens, 0.088, use_pdl=True)

    qkv.normal_()
    graph, static_out = captured(step)
    for replay in range(20):
        qkv.normal_()
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = float("nan")
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = float("nan")
        graph.replay()
        q = qk_norm_rope_store_kv(qkv, positions, rotary, heads, None, 1e-6, (k_cache, v_cache, slots))
        plain = decode_attention(q, k_cache, v_cache, tables, context_lens, 0.088)
        assert not static_out.isnan().any(), f"replay {replay}: a poisoned own token was read before the wait"
        assert torch.equal(static_out, plain), f"replay {replay}"
