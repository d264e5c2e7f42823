"""Cases for the MoE kernels (gpu/kernels/moe_route.py, moe_align.py, fused_moe.py) under Triton's interpreter on
the CPU, run by tests/unit/test_attention_kernels_interpreted.py in a process with TRITON_INTERPRET=1: their indexing on
small shapes against the torch references (float32 and float16: the interpreter's bfloat16 dot is not numpy's;
tests/gpu/test_fused_moe.py checks bf16 on CUDA)."""

import pytest
import torch

from gpu.kernels.fused_moe_configs import GemmTiles, MoeConfig
from gpu.kernels.moe_align import align, chunk_size
from gpu.kernels.moe_route import route
from gpu.layers.moe import Routing, route_reference
from tests.moe_cases import aligned_reference, kernel_and_reference, lowest_ids_first, random_experts, random_routing

ROUTINGS = {
    "softmax": Routing(6, 2),
    "softmax-unnormalized": Routing(60, 4, renormalize=False),
    "sigmoid-grouped": Routing(32, 6, "sigmoid", True, 4, 2, 2.5, has_correction_bias=True),
    "sigmoid-ungrouped": Routing(12, 3, "sigmoid", True, has_correction_bias=True),
    "top-k-softmax": Routing(8, 4, "top_k_softmax", has_bias=True),
}


@pytest.mark.parametrize("name", ROUTINGS)
def test_route_matches_the_reference(name: str) -> None:
    routing = ROUTINGS[name]
    generator = torch.Generator().manual_seed(len(name))
    logits = torch.randn(23, routing.num_experts, generator=generator) * 2
    bias = torch.randn(routing.num_experts, generator=generator) if routing.has_correction_bias else None
    weights, ids = route(logits, routing, bias)
    expected = route_reference(logits, routing, bias)
    order, expected_order = ids.long().argsort(dim=-1), expected.expert_ids.argsort(dim=-1)
    assert torch.equal(ids.long().gather(1, order), expected.expert_ids.gather(1, expected_order))
    torch.testing.assert_close(weights.gather(1, order), expected.weights.gather(1, expected_order))


# Decode-step routings at the real widths, on logits with ties: every case checks the kernel's experts against the
# rule it promises (best choice first, a tie to the lower expert id) and its weights against route_reference's.
DECODE_ROUTINGS = {
    "qwen3-moe": Routing(128, 8),
    "wide-softmax": Routing(256, 8),
    "sigmoid": Routing(128, 8, "sigmoid", True),
    "sigmoid-bias": Routing(128, 8, "sigmoid", True, has_correction_bias=True),
    "deepseek-v3-groups": Routing(256, 8, "sigmoid", True, 8, 4, 2.5, has_correction_bias=True),
    "gpt-oss": Routing(32, 4, "top_k_softmax", has_bias=True),
    "wide-top-k-softmax": Routing(128, 4, "top_k_softmax"),
}
LOGITS = {
    "normal": lambda shape, generator: torch.randn(shape, generator=generator) * 2,
    "levels": lambda shape, generator: torch.randint(-3, 2, shape, generator=generator).float(),  # ties, negatives
    "equal": lambda shape, generator: torch.zeros(shape),
    "signed-zeros": lambda shape, generator: torch.tensor([0.0, -0.0, -1.0])[torch.randint(0, 3, shape,
                                                                                            generator=generator)],
}


@pytest.mark.parametrize("num_tokens", [1, 2, 3, 4])
@pytest.mark.parametrize("logits_kind", LOGITS)
@pytest.mark.parametrize("name", DECODE_ROUTINGS)
def test_route_at_a_decode_step_picks_ties_by_lower_id(name: str, logits_kind: str, num_tokens: int) -> None:
    routing = DECODE_ROUTINGS[name]
    generator = torch.Generator().manual_seed(num_tokens)
    # Every group alike (logits and bias): tied groups, any of which gives the reference the same weights.
    logits = LOGITS[logits_kind]((num_tokens, routing.num_experts // routing.num_groups), generator)
    logits = logits.repeat(1, routing.num_groups)
    bias = None
    if routing.has_correction_bias:  # mostly negative choices, and ties where the logits tie
        bias = LOGITS["levels"]((routing.num_experts // routing.num_groups,), generator).repeat(routing.num_groups)
    weights, ids = route(logits, routing, bias)
    expected = route_reference(logits, routing, bias)
    assert torch.equal(ids.long(), lowest_ids_first(logits, routing, bias))
    torch.testing.assert_close(weights.sort(dim=-1)[0], expected.weights.sort(dim=-1)[0])


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k", "block_m", "chunk"), [
    (1, 8, 2, 16, None), (5, 6, 3, 16, None), (37, 12, 4, 32, None),  # one program
    (45, 8, 2, 16, 16), (200, 6, 4, 64, 32),  # several chunks (25 of them: more than one pass over 16 histograms)
])
def test_align_sorts_pairs_by_expert_in_padded_tiles(num_tokens: int, num_experts: int, top_k: int, block_m: int,
                                                     chunk: int | None) -> None:
    ids = random_routing(num_tokens, num_experts, top_k, seed=num_tokens, skewed=num_tokens > 100).expert_ids
    aligned = align(ids, num_experts, block_m, chunk)
    tiles, tile_experts = aligned_reference(ids, num_experts, block_m)
    num_padded = int(aligned.num_padded)
    assert num_padded == len(tiles) * block_m
    assert aligned.sorted_pairs[:num_padded].view(-1, block_m).tolist() == tiles
    assert aligned.block_experts[: len(tiles)].tolist() == tile_experts
    assert (aligned.sorted_pairs[num_padded:] == ids.numel()).all()


def test_chunks_hold_a_decode_step_and_bound_the_tile() -> None:
    assert chunk_size(8, 128) == 16 and chunk_size(256 * 8, 128) == 128 and chunk_size(8192 * 8, 128) == 128
    assert chunk_size(8192 * 8, 256) == 64


SMALL_TILES = MoeConfig(16, GemmTiles(16, 16, group_m=2, num_stages=1), GemmTiles(32, 16, num_stages=1))
UNEVEN_TILES = MoeConfig(32, GemmTiles(32, 32, num_stages=1), GemmTiles(16, 32, group_m=3, num_stages=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k", "hidden", "intermediate", "act", "has_bias",
                          "config"), [
    (1, 4, 2, 32, 16, "silu", False, SMALL_TILES),
    (7, 8, 3, 48, 24, "silu", False, UNEVEN_TILES),  # K not a multiple of BLOCK_K; N past the last column tile
    (20, 6, 1, 32, 40, "clamped_swiglu", True, SMALL_TILES),
    (33, 5, 2, 40, 20, "clamped_swiglu", True, None),  # the rule's config
])
def test_fused_experts_match_the_torch_reference(num_tokens: int, num_experts: int, top_k: int, hidden: int,
                                                  intermediate: int, act: str, has_bias: bool,
                                                  config: MoeConfig | None, dtype: torch.dtype) -> None:
    experts = random_experts(num_experts, hidden, intermediate, act, has_bias, seed=num_tokens)
    routed = random_routing(num_tokens, num_experts, top_k, seed=num_tokens)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
    out, reference = kernel_and_reference(experts, x, routed, config)  # a config given: the grouped GEMMs at any size
    assert out.dtype == dtype and out.shape == x.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    scale = reference.abs().max().item() + 1
    torch.testing.assert_close(out.float(), reference, rtol=tolerance, atol=tolerance * scale)


def test_shared_experts_output_is_added_in_the_sum() -> None:
    from gpu.kernels.fused_moe import fused_experts
    from gpu.layers.moe import activation

    experts = random_experts(6, 32, 16, seed=5)
    routed = random_routing(9, 6, 2, seed=5)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(2))
    add = torch.randn(9, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        alone = fused_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                              activation(experts.spec))
        summed = fused_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                               activation(experts.spec), add=add)
    torch.testing.assert_close(summed, alone + add, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k", "hidden", "intermediate", "act", "config"), [
    (1, 4, 2, 64, 32, "clamped_swiglu", SMALL_TILES),  # K tiles of 16 widened to whole blocks of 32
    (7, 8, 3, 96, 64, "silu", UNEVEN_TILES),  # columns past the last column tile
    (33, 5, 2, 160, 96, "clamped_swiglu", None),  # the rule's config: K tiles of 64 or 128 with a partial last one
])
def test_mxfp4_experts_match_the_reference_on_their_dequantization(
        num_tokens: int, num_experts: int, top_k: int, hidden: int, intermediate: int, act: str,
        config: MoeConfig | None) -> None:
    import gpu.kernels.fused_moe as fused
    from tests.moe_cases import quantized_kernel_and_reference, random_mxfp4_experts

    experts = random_mxfp4_experts(num_experts, hidden, intermediate, act, seed=num_tokens)
    routed = random_routing(num_tokens, num_experts, top_k, seed=num_tokens)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(1))
    with pytest.MonkeyPatch.context() as patch:
        if config is not None:
            patch.setattr(fused, "config_for", lambda *args: config)
        out, reference = quantized_kernel_and_reference(experts, x, routed)
    scale = reference.abs().max().item() + 1
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k", "hidden", "intermediate", "block", "config"), [
    (1, 4, 2, 64, 32, (16, 16), SMALL_TILES),
    (7, 8, 3, 80, 64, (32, 32), UNEVEN_TILES),  # K (80) ends in a partial tile and a partial block of scales
    (33, 5, 2, 96, 64, (16, 32), None),  # the rule's config (K tiles of 64 narrowed to the blocks' 32 columns)
])
def test_fp8_block_experts_match_the_reference_on_their_dequantization(
        num_tokens: int, num_experts: int, top_k: int, hidden: int, intermediate: int, block: tuple[int, int],
        config: MoeConfig | None) -> None:
    import gpu.kernels.fused_moe as fused
    from tests.moe_cases import quantized_kernel_and_reference, random_fp8_experts

    experts = random_fp8_experts(num_experts, hidden, intermediate, block, "silu", has_bias=False, seed=num_tokens)
    routed = random_routing(num_tokens, num_experts, top_k, seed=num_tokens)
    x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(1))
    with pytest.MonkeyPatch.context() as patch:
        if config is not None:
            patch.setattr(fused, "config_for", lambda *args: config)
        out, reference = quantized_kernel_and_reference(experts, x, routed)
    scale = reference.abs().max().item() + 1
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5 * scale)
