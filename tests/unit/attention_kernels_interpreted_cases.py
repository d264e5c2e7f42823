"""The decode attention kernel (gpu/kernels/decode_attention.py) and the q/k norm + RoPE kernel that writes K/V
to the cache (gpu/kernels/qk_norm_rope.py) run by Triton's interpreter on the CPU, in float32, against the torch
reference (gpu/attention/torch_ref.py, gpu/layers/): their indexing and masks (rows shorter than a tile, empty
rows, segments without a tile, padding tokens), and an FP8 cache read by both attention kernels and written with
its scales. tests/gpu/test_kernels.py and test_fused_kernels.py check the
compiled kernels on CUDA."""

import os

import pytest
import torch

from gpu.attention import torch_ref

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    # Triton's own helpers (tl.sum, tl.max, tl.cdiv...) are interpreted only when the variable is set before
    # triton is first imported: tests/unit/test_attention_kernels_interpreted.py runs this file in a process so.
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gpu.kernels import decode_attention as decode_module  # noqa: E402

BLOCK_SIZE, HEAD_DIM, GROUP, NUM_KV_HEADS = 16, 32, 2, 2


def paged_inputs(context_lens: list[int], seed: int) -> tuple[torch.Tensor, ...]:
    """(query, k_cache, v_cache, block_tables, context_lens): each row's blocks shuffled, the table wider than
    needed (as a graph's is) and padded with stale block ids, the caches random (NaN in unowned blocks)."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_row = [-(-n // BLOCK_SIZE) for n in context_lens]
    num_blocks = sum(blocks_per_row) + 3
    width = max(blocks_per_row) + 2
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    tables, used = [], 0
    for n in blocks_per_row:
        tables.append(pool[used : used + n] + pool[:1] * (width - n))
        used += n
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache, v_cache = torch.randn(2, *shape, generator=generator).unbind(0)
    owned = torch.tensor(pool[:used])
    unowned = torch.ones(num_blocks, dtype=torch.bool).index_fill_(0, owned, False)
    k_cache[unowned], v_cache[unowned] = float("nan"), float("nan")
    query = torch.randn(len(context_lens), NUM_KV_HEADS * GROUP, HEAD_DIM, generator=generator)
    return (query, k_cache, v_cache, torch.tensor(tables, dtype=torch.int32),
            torch.tensor(context_lens, dtype=torch.int32))


def reference(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
              lens: torch.Tensor, scale: float) -> torch.Tensor:
    starts = torch.arange(query.shape[0] + 1, dtype=torch.int32)
    out = torch_ref.paged_attention(query, k_cache, v_cache, starts, lens.clamp_min(1), tables, scale)
    return torch.where((lens > 0)[:, None, None], out, 0.0)  # an empty row's output is zeros


# 0: a padding row; 1, 15, 16, 17: around one 16-token tile; the longer ones span several tiles per split.
CONTEXT_LENS = [0, 1, 15, 16, 17, 64, 100, 161]


@pytest.mark.parametrize("num_splits", [1, 2, 4, 16])
def test_decode_kernel_matches_reference(num_splits: int) -> None:
    query, k_cache, v_cache, tables, lens = paged_inputs(CONTEXT_LENS, seed=num_splits)
    config = decode_module.DecodeConfig(block_n=16, num_splits=num_splits)
    out = torch.full_like(query, float("nan"))
    decode_module.decode_attention(query, k_cache, v_cache, tables, lens, 0.2, out=out, config=config)
    torch.testing.assert_close(out, reference(query, k_cache, v_cache, tables, lens, 0.2), atol=1e-5, rtol=1e-5)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


def test_decode_rows_in_launch_order() -> None:
    """Rows launched longest first give each row its own output; one row ignores the order (it is not read)."""
    config = decode_module.DecodeConfig(block_n=16, num_splits=4)
    for seed, lens in enumerate([[161, 40, 0, 33], [17]]):
        query, k_cache, v_cache, tables, context_lens = paged_inputs(lens, seed)
        row_order = torch.argsort(context_lens, descending=True).to(torch.int32)
        out = decode_module.decode_attention(query, k_cache, v_cache, tables, context_lens, 0.3, config=config,
                                             row_order=row_order)
        expected = reference(query, k_cache, v_cache, tables, context_lens, 0.3)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_default_splits_for_one_row_of_a_wide_table() -> None:
    """One row in a table sized for a long context: the split count from static shapes leaves most splits
    without a tile; they write empty partials that the merge ignores."""
    query, k_cache, v_cache, tables, lens = paged_inputs([300], seed=5)
    wide = torch.cat([tables, tables[:, :1].expand(1, 60)], dim=1)
    assert decode_module.choose_num_splits(1, NUM_KV_HEADS, wide.shape[1] * BLOCK_SIZE, 132) > 300 // 64
    out = decode_module.decode_attention(query, k_cache, v_cache, wide, lens, 0.2)
    torch.testing.assert_close(out, reference(query, k_cache, v_cache, tables, lens, 0.2), atol=1e-5, rtol=1e-5)


# (num_heads, num_kv_heads, head_dim): GQA with the values in a program of their own, MQA, heads split unevenly.
QKV_HEADS = [(16, 8, 64), (4, 1, 32), (6, 2, 16)]


@pytest.mark.parametrize("heads", QKV_HEADS, ids=str)
@pytest.mark.parametrize("has_norm", [True, False])
def test_qk_norm_rope_store_kv_writes_what_store_kv_would(heads: tuple[int, int, int], has_norm: bool) -> None:
    """q equal to qk_norm_rope's; the caches equal to store_kv of its k and the values, padding tokens unwritten."""
    from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv

    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(head_dim)
    num_tokens, max_position, num_blocks = 5, 64, 4
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim + 8, generator=generator)[:, :-8]
    positions = torch.randint(0, max_position, (num_tokens,), generator=generator)
    angles = torch.rand(max_position, head_dim // 2, generator=generator) * 6
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    norms = tuple(1 + 0.5 * torch.randn(2, head_dim, generator=generator)) if has_norm else None
    slot_mapping = torch.tensor([9, -1, 0, 63, 17])  # token 1 is a padding token
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(2, *shape, generator=generator).unbind(0)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    q, k = qk_norm_rope(qkv, positions, cos, sin, heads, norms, 1e-6)
    values = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    torch_ref.store_kv(k, values, expected_k, expected_v, slot_mapping)
    fused_q = qk_norm_rope_store_kv(qkv, positions, (cos, sin), heads, norms, 1e-6, (k_cache, v_cache, slot_mapping))
    assert torch.equal(fused_q, q)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)



def _fp8(cache: torch.Tensor) -> torch.Tensor:
    return cache.to(torch.float8_e4m3fn)  # NaN stays NaN: unowned blocks still poison a wrong read


def test_decode_and_prefill_read_an_fp8_cache() -> None:
    """An FP8 cache is read as the reference reads it (its values converted, the scales the caller's)."""
    from gpu.kernels.prefill_attention import prefill_attention

    query, k_cache, v_cache, tables, lens = paged_inputs(CONTEXT_LENS, seed=11)
    k_cache, v_cache = _fp8(k_cache), _fp8(v_cache)
    out = decode_module.decode_attention(query, k_cache, v_cache, tables, lens, 0.2,
                                         config=decode_module.DecodeConfig(block_n=16, num_splits=4))
    torch.testing.assert_close(out, reference(query, k_cache, v_cache, tables, lens, 0.2), atol=1e-5, rtol=1e-5)
    rows = lens[1:]  # a prefill's rows: each row's last 5 positions (all of a shorter one's)
    query_lens = rows.clamp(max=5)
    starts = torch.cat([torch.zeros(1, dtype=torch.int32), query_lens.cumsum(0).to(torch.int32)])
    queries = torch.randn(int(starts[-1]), query.shape[1], HEAD_DIM, generator=torch.Generator().manual_seed(2))
    out = prefill_attention(queries, k_cache, v_cache, starts, rows, tables[1:], 0.2)
    expected = torch_ref.paged_attention(queries, k_cache, v_cache, starts, rows, tables[1:], 0.2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_decode_reads_an_fp8_cache_in_float16_for_a_16_bit_query() -> None:
    """A bf16 query over an FP8 cache multiplies in float16 (the cache's values exact there, the query scaled into
    float16's range by about a power of two): the float32 reference's output within bf16's rounding, and the same
    for a query far past float16's largest value (65,504) with a scale as much smaller."""
    query, k_cache, v_cache, tables, lens = paged_inputs(CONTEXT_LENS, seed=12)
    k_cache, v_cache = _fp8(k_cache), _fp8(v_cache)
    query = query.bfloat16()
    expected = reference(query.float(), k_cache, v_cache, tables, lens, 0.2)
    config = decode_module.DecodeConfig(block_n=16, num_splits=2)
    out = decode_module.decode_attention(query, k_cache, v_cache, tables, lens, 0.2, config=config)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    huge = decode_module.decode_attention(query * 2.0**18, k_cache, v_cache, tables, lens, 0.2 / 2.0**18,
                                          config=config)
    torch.testing.assert_close(huge.float(), expected, atol=1e-2, rtol=1e-2)


@triton.jit
def _as_fp8_kernel(x_ptr, out_ptr, N: tl.constexpr):  # noqa: ANN001 - a Triton kernel
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv))


def _as_fp8(x: torch.Tensor) -> torch.Tensor:
    """x (float32) rounded to FP8 by Triton's own conversion: the interpreter's rounding, which the kernels' stores
    take (it differs from torch's on some values a binade apart; the GPU's is tested on CUDA)."""
    flat = x.contiguous().view(-1)
    out = torch.empty(triton.next_power_of_2(flat.numel()), dtype=torch.float8_e4m3fn)
    padded = torch.zeros(out.numel())
    padded[: flat.numel()] = flat
    _as_fp8_kernel[(1,)](padded, out, N=out.numel())
    return out[: flat.numel()].view(x.shape)


def test_qk_norm_rope_store_kv_into_an_fp8_cache() -> None:
    """Keys rotated and values as read, each divided by its scale in float32 and stored as FP8."""
    from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv

    heads, scales = (4, 2, 32), (0.5, 0.25)
    num_heads, num_kv_heads, head_dim = heads
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn(4, (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    positions = torch.tensor([3, 0, 9, 5])
    angles = torch.rand(16, head_dim // 2, generator=generator) * 6
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    slot_mapping = torch.tensor([9, -1, 0, 30])
    k_cache, v_cache = _fp8(torch.randn(2, 2, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)).unbind(0)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    _, k = qk_norm_rope(qkv, positions, cos, sin, heads)
    values = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(4, num_kv_heads, head_dim)
    written = slot_mapping >= 0
    expected_k.view(-1, num_kv_heads, head_dim)[slot_mapping[written]] = _as_fp8(k[written] / scales[0])
    expected_v.view(-1, num_kv_heads, head_dim)[slot_mapping[written]] = _as_fp8(values[written] / scales[1])
    qk_norm_rope_store_kv(qkv, positions, (cos, sin), heads, None, 1e-6, (k_cache, v_cache, slot_mapping),
                          kv_scales=scales)
    assert torch.equal(k_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), expected_v.view(torch.uint8))
