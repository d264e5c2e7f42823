"""The fused decode attention (gpu/kernels/fused_decode_attention.py) under Triton's interpreter on the CPU: its
output and the cache it leaves equal, bit for bit, what qk_norm_rope_store_kv then decode_attention give, over
splits from one to more than a row has tiles, GQA groups from 1 to 8, own tokens in a segment's first, middle and
last tile and on either side of a block boundary, a padding row, launch orders, the variants (window, sinks,
soft-cap), an FP8 cache with its scales, Llama's rows without norms and Qwen3-Next's (Gemma's norm convention, a
partial rotation, queries between their gates). tests/gpu/test_fused_decode_attention_gpu.py checks it on CUDA."""

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    # Triton's own helpers are interpreted only when the variable is set before triton is first imported:
    # tests/unit/test_attention_kernels_interpreted.py runs this file in a process so.
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.attention.qkv_heads import QkvHeads  # noqa: E402
from gpu.attention.variant import PLAIN, AttentionVariant  # noqa: E402
from gpu.kernels.decode_attention import DecodeConfig, decode_attention  # noqa: E402
from gpu.kernels.fused_decode_attention import fused_decode_attention  # noqa: E402
from gpu.kernels.qk_norm_rope import qk_norm_rope_store_kv  # noqa: E402

BLOCK_SIZE, BLOCK_N, MAX_POSITION = 16, 16, 256
# 0: a padding row; 1, 15, 16: the own token in the first tile (16: a block's last slot); 17: a block's first slot;
# 40, 100, 161: in a middle or last tile of several, whose segments at 2 or 4 splits begin before it.
CONTEXT_LENS = [0, 1, 15, 16, 17, 40, 100, 161]


def paged_rows(context_lens: list[int], num_kv_heads: int, head_dim: int, seed: int,
               cache_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """(k_cache, v_cache, block_tables, context_lens, slot_mapping): each row's blocks shuffled, the table wider than
    needed and padded with stale ids, the caches random with NaN in unowned blocks (a wrong read shows), each row's
    own token at slot of position context_len - 1 (-1 for a padding row)."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_row = [-(-n // BLOCK_SIZE) for n in context_lens]
    num_blocks = sum(blocks_per_row) + 3
    width = max(blocks_per_row) + 2
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    tables, slots, used = [], [], 0
    for n, blocks in zip(context_lens, blocks_per_row, strict=True):
        tables.append(pool[used : used + blocks] + pool[:1] * (width - blocks))
        slots.append(tables[-1][(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE if n else -1)
        used += blocks
    k_cache, v_cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).unbind(0)
    unowned = torch.ones(num_blocks, dtype=torch.bool).index_fill_(0, torch.tensor(pool[:used]), False)
    k_cache[unowned], v_cache[unowned] = float("nan"), float("nan")
    return (k_cache.to(cache_dtype), v_cache.to(cache_dtype), torch.tensor(tables, dtype=torch.int32),
            torch.tensor(context_lens, dtype=torch.int32), torch.tensor(slots))


def qkv_rows(layout: QkvHeads, num_rows: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random qkv rows with a column more than the heads' (qkv's rows are strided)."""
    num_heads, num_kv_heads, head_dim = layout.heads
    width = ((2 if layout.has_output_gate else 1) * num_heads + 2 * num_kv_heads) * head_dim
    generator = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(num_rows, width + 1, generator=generator)).to(dtype)[:, :width]


def layout_of(heads: tuple[int, int, int], has_norm: bool, seed: int, rotary_dim: int | None = None,
              **options: object) -> QkvHeads:
    head_dim = heads[2]
    generator = torch.Generator().manual_seed(seed)
    angles = torch.rand(MAX_POSITION, (rotary_dim or head_dim) // 2, generator=generator) * 6
    norms = tuple(1 + 0.5 * torch.randn(2, head_dim, generator=generator)) if has_norm else None
    return QkvHeads(heads, (angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)), norms, **options)


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bytes: equal bits compare equal, NaN too."""
    return t.contiguous().view(torch.uint8)


def assert_fused_equals_two_kernels(layout: QkvHeads, context_lens: list[int], num_splits: int, seed: int,
                                    variant: AttentionVariant = PLAIN, row_order: torch.Tensor | None = None,
                                    cache_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Runs both on the same inputs and asserts equal outputs and caches; returns the fused output."""
    num_heads, num_kv_heads, head_dim = layout.heads
    k_cache, v_cache, tables, lens, slots = paged_rows(context_lens, num_kv_heads, head_dim, seed, cache_dtype)
    qkv = qkv_rows(layout, len(context_lens), seed)
    positions = (lens.to(torch.int64) - 1).clamp_min(0)
    config = DecodeConfig(block_n=BLOCK_N, num_splits=num_splits)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    q = qk_norm_rope_store_kv(qkv, positions, layout.rotary, layout.heads, layout.norm_weights, layout.eps,
                              (expected_k, expected_v, slots), norm_convention=layout.norm_convention,
                              kv_scales=layout.kv_scales, has_output_gate=layout.has_output_gate)
    expected = decode_attention(q, expected_k, expected_v, tables, lens, 0.3, config=config, row_order=row_order,
                                variant=variant)
    out = fused_decode_attention(qkv, positions, layout, (k_cache, v_cache, slots), (tables, lens, row_order), 0.3,
                                 variant, config=config)
    assert torch.equal(bits(k_cache), bits(expected_k)) and torch.equal(bits(v_cache), bits(expected_v))
    assert torch.equal(bits(out), bits(expected))
    assert not out[lens > 0].isnan().any() and torch.equal(out[lens == 0], torch.zeros_like(out[lens == 0]))
    return out


# (num_heads, num_kv_heads, head_dim): GQA group 4, MHA (group 1), MQA (group 8, a 16-row tile of queries half used).
HEADS = [(8, 2, 32), (4, 4, 16), (8, 1, 32)]


@pytest.mark.parametrize("num_splits", [1, 2, 4, 16])
def test_splits_from_one_to_more_than_tiles(num_splits: int) -> None:
    assert_fused_equals_two_kernels(layout_of(HEADS[0], True, seed=1), CONTEXT_LENS, num_splits, seed=num_splits)


@pytest.mark.parametrize("heads", HEADS[1:], ids=str)
@pytest.mark.parametrize("has_norm", [True, False])
def test_gqa_groups_with_and_without_norms(heads: tuple[int, int, int], has_norm: bool) -> None:
    assert_fused_equals_two_kernels(layout_of(heads, has_norm, seed=2), CONTEXT_LENS, 2, seed=3)


def test_rows_in_launch_order() -> None:
    lens = [161, 40, 0, 17]
    order = torch.argsort(torch.tensor(lens), descending=True).to(torch.int32)
    assert_fused_equals_two_kernels(layout_of(HEADS[0], True, seed=4), lens, 4, seed=4, row_order=order)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_window_sinks_and_softcap(num_splits: int) -> None:
    sinks = torch.randn(HEADS[0][0], generator=torch.Generator().manual_seed(5))
    variant = AttentionVariant(sliding_window=20, sinks=sinks, softcap=5.0)
    assert_fused_equals_two_kernels(layout_of(HEADS[0], True, seed=5), CONTEXT_LENS, num_splits, seed=6,
                                    variant=variant)


def test_fp8_cache_with_its_scales() -> None:
    layout = layout_of(HEADS[0], True, seed=7, kv_scales=(0.5, 0.25))
    assert_fused_equals_two_kernels(layout, CONTEXT_LENS, 2, seed=7, cache_dtype=torch.float8_e4m3fn)


def test_partial_rotation_gates_and_gemmas_norm_convention() -> None:
    layout = layout_of((8, 2, 32), True, seed=8, rotary_dim=8, norm_convention=(1.0, True), has_output_gate=True)
    assert_fused_equals_two_kernels(layout, CONTEXT_LENS, 2, seed=8)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_the_own_token_is_attended_from_registers_not_the_cache(num_splits: int) -> None:
    """The own key and value are made from qkv and attended to as made, in a segment's first tile (10 keys; 40 at
    two splits, whose second segment is tile 2 alone) or a later one (40 keys at one split: tile 2 of 0-2): with the
    store skipped (slot -1) and the own token's cache slot NaN, the output is the one of a launch that stores them."""
    layout = layout_of(HEADS[0], True, seed=9)
    k_cache, v_cache, tables, lens, slots = paged_rows([40, 10], 2, 32, seed=9)
    qkv, positions = qkv_rows(layout, 2, seed=9), lens.to(torch.int64) - 1
    config = DecodeConfig(block_n=BLOCK_N, num_splits=num_splits)
    stored = fused_decode_attention(qkv, positions, layout, (k_cache.clone(), v_cache.clone(), slots),
                                    (tables, lens, None), 0.3, config=config)
    k_cache.view(-1, 2, 32)[slots], v_cache.view(-1, 2, 32)[slots] = float("nan"), float("nan")
    unstored = fused_decode_attention(qkv, positions, layout, (k_cache, v_cache, torch.full_like(slots, -1)),
                                      (tables, lens, None), 0.3, config=config)
    assert torch.equal(unstored, stored) and not stored.isnan().any()
    assert k_cache.view(-1, 2, 32)[slots].isnan().all(), "slot -1: nothing written"


def test_refuses_what_it_does_not_take() -> None:
    layout = layout_of(HEADS[0], True, seed=10)
    k_cache, v_cache, tables, lens, slots = paged_rows([5, 9], 2, 32, seed=10)
    qkv = qkv_rows(layout, 2, seed=10)
    with pytest.raises(ValueError, match="qkv must hold the values"):
        fused_decode_attention(qkv[:, :-1], lens.to(torch.int64) - 1, layout, (k_cache, v_cache, slots),
                               (tables, lens, None), 0.3)
    with pytest.raises(ValueError, match="positions"):
        fused_decode_attention(qkv, lens - 1, layout, (k_cache, v_cache, slots), (tables, lens, None), 0.3)
