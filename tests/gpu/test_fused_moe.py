"""The MoE kernels (gpu/kernels/moe_route.py, moe_align.py, fused_moe.py, moe_decode.py) on CUDA against the torch
references of gpu/layers/moe.py: over row counts 1..512 (and prompt-sized steps), several expert counts and top-k,
both activations, with and without biases, bf16 and float32, and inside a CUDA graph replayed on new routings; the
decode kernels against the grouped GEMMs at 1..4 tokens.

Tolerance (bf16): the kernels store the activated intermediate and the output in bf16 once each, the reference
sums in float32 on the same rounded weights and inputs: a few bf16 roundings of the output's scale. float32: the
kernels' products are exact (no TF32), so only the order of the sums differs.
"""

from dataclasses import replace

import pytest
import torch

from gpu.kernels import fused_moe_configs
from gpu.kernels.fused_moe_configs import config_for, row_bucket
from gpu.layers.moe import RoutedTokens, Router, Routing, activation, experts_reference, route_reference
from tests.gpu.graph_capture import captured
from tests.moe_cases import (
    aligned_reference,
    cast,
    kernel_and_reference,
    lowest_ids_first,
    random_experts,
    random_routing,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels need CUDA")
fused_moe = pytest.importorskip("gpu.kernels.fused_moe")
moe_align = pytest.importorskip("gpu.kernels.moe_align")
moe_decode = pytest.importorskip("gpu.kernels.moe_decode")
moe_route = pytest.importorskip("gpu.kernels.moe_route")

ROW_COUNTS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 64, 100, 128, 200, 256, 333, 512)
# (experts, top_k, hidden, intermediate, activation, biases): Qwen3-30B-A3B's layer, Mixtral-like, gpt-oss-20b's
# (clamped SwiGLU and biases), and odd sizes that are no multiple of any tile.
SHAPES = {
    "qwen3-30b-a3b": (128, 8, 2048, 768, "silu", False),
    "mixtral-like": (8, 2, 1024, 1536, "silu", False),
    "gpt-oss-20b": (32, 4, 2880, 2880, "clamped_swiglu", True),
    "odd": (60, 3, 200, 72, "silu", False),
}


def assert_close(out: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and not out.isnan().any()
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-4
    scale = reference.abs().max().item() + 1e-3
    torch.testing.assert_close(out.float(), reference, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_experts_match_the_reference_over_row_counts(shape: str) -> None:
    num_experts, top_k, hidden, intermediate, act, has_bias = SHAPES[shape]
    experts = random_experts(num_experts, hidden, intermediate, act, has_bias, device="cuda")
    for num_tokens in ROW_COUNTS:
        x = torch.randn(num_tokens, hidden, device="cuda", generator=torch.Generator("cuda").manual_seed(num_tokens))
        routed = random_routing(num_tokens, num_experts, top_k, "cuda", seed=num_tokens, skewed=num_tokens % 2 == 1)
        out, reference = kernel_and_reference(experts, x.bfloat16(), routed)
        assert_close(out, reference, torch.bfloat16)


@pytest.mark.parametrize("num_tokens", [1, 7, 64, 300, 2048, 8192])
def test_float32_products_are_exact(num_tokens: int) -> None:
    experts = random_experts(16, 256, 128, "silu", device="cuda")
    x = torch.randn(num_tokens, 256, device="cuda")
    out, reference = kernel_and_reference(experts, x, random_routing(num_tokens, 16, 4, "cuda"))
    assert_close(out, reference, torch.float32)


def test_prompt_sized_steps_take_taller_tiles_and_stay_right() -> None:
    num_experts, top_k, hidden, intermediate, act, has_bias = SHAPES["qwen3-30b-a3b"]
    assert config_for(8192, num_experts, top_k, intermediate, hidden).block_m > config_for(1, 128, 8, 768, 2048).block_m
    experts = random_experts(num_experts, hidden, intermediate, act, has_bias, device="cuda")
    for num_tokens in (1024, 3000, 8192):
        x = torch.randn(num_tokens, hidden, device="cuda")
        out, reference = kernel_and_reference(experts, x.bfloat16(), random_routing(num_tokens, num_experts, top_k,
                                                                                    "cuda", seed=num_tokens))
        assert_close(out, reference, torch.bfloat16)


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k", "block_m"),
                         [(1, 128, 8, 16), (37, 128, 8, 16), (512, 128, 8, 32), (8192, 128, 8, 128), (4096, 256, 8, 64),
                          (100, 60, 3, 16), (2000, 8, 2, 64)])
def test_align_on_cuda_matches_a_stable_sort(num_tokens: int, num_experts: int, top_k: int, block_m: int) -> None:
    ids = random_routing(num_tokens, num_experts, top_k, "cuda", seed=num_tokens, skewed=True).expert_ids
    aligned = moe_align.align(ids, num_experts, block_m)
    tiles, tile_experts = aligned_reference(ids.cpu(), num_experts, block_m)
    num_padded = int(aligned.num_padded)
    assert num_padded == len(tiles) * block_m
    assert aligned.sorted_pairs[:num_padded].view(-1, block_m).tolist() == tiles
    assert aligned.block_experts[: len(tiles)].tolist() == tile_experts
    assert (aligned.sorted_pairs[num_padded:] == ids.numel()).all()


ROUTINGS = {
    "qwen3-moe": Routing(128, 8),
    "qwen3-moe-unnormalized": Routing(128, 8, renormalize=False),
    "mixtral": Routing(8, 2),
    "glm-4.5": Routing(160, 8, "sigmoid", True, 1, 1, 2.5, has_correction_bias=True, float32_logits=True),
    "deepseek-v3-groups": Routing(256, 8, "sigmoid", True, 8, 4, 2.5, has_correction_bias=True, float32_logits=True),
    "gpt-oss": Routing(32, 4, "top_k_softmax", has_bias=True),
}


@pytest.mark.parametrize("name", ROUTINGS)
def test_route_on_cuda_matches_the_reference(name: str) -> None:
    routing = ROUTINGS[name]
    generator = torch.Generator("cuda").manual_seed(7)
    bias = torch.randn(routing.num_experts, device="cuda", generator=generator) if routing.has_correction_bias else None
    for num_tokens in ROW_COUNTS:
        # Distinct logits, exact in bf16: no ties, whose order torch.topk leaves open.
        ranks = torch.rand(num_tokens, routing.num_experts, device="cuda", generator=generator).argsort(dim=-1)
        logits = (ranks.float() - routing.num_experts / 2) / 16
        if not routing.float32_logits:
            logits = logits.bfloat16()
        weights, ids = moe_route.route(logits, routing, bias)
        expected = route_reference(logits, routing, bias)
        order, expected_order = ids.long().argsort(dim=-1), expected.expert_ids.argsort(dim=-1)
        assert torch.equal(ids.long().gather(1, order), expected.expert_ids.gather(1, expected_order)), num_tokens
        torch.testing.assert_close(weights.gather(1, order), expected.weights.gather(1, expected_order))


@pytest.mark.parametrize("name", ROUTINGS)
def test_route_on_cuda_picks_ties_by_lower_id(name: str) -> None:
    """Logits on five levels (ties, negative choices with a bias), every group alike (tied groups): the experts by
    the kernel's rule, best first and a tie to the lower id; the weights as the reference's (which ties alike)."""
    routing = ROUTINGS[name]
    group_size = routing.num_experts // routing.num_groups
    generator = torch.Generator("cuda").manual_seed(3)

    def levels(*shape: int) -> torch.Tensor:
        return torch.randint(-3, 2, shape, device="cuda", generator=generator).float()

    bias = levels(group_size).repeat(routing.num_groups) if routing.has_correction_bias else None
    for num_tokens in (1, 2, 3, 4, 64):
        logits = levels(num_tokens, group_size).repeat(1, routing.num_groups)
        if not routing.float32_logits:
            logits = logits.bfloat16()
        weights, ids = moe_route.route(logits, routing, bias)
        expected = route_reference(logits, routing, bias)
        rule = lowest_ids_first(logits.cpu(), routing, None if bias is None else bias.cpu())
        assert torch.equal(ids.long().cpu(), rule), num_tokens
        torch.testing.assert_close(weights.sort(dim=-1)[0], expected.weights.sort(dim=-1)[0])


@pytest.mark.parametrize("use_pdl", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 8, 64, 256])
def test_routing_and_experts_in_a_cuda_graph_follow_new_inputs(num_tokens: int, use_pdl: bool) -> None:
    num_experts, top_k, hidden, intermediate, act, _ = SHAPES["qwen3-30b-a3b"]
    experts = cast(random_experts(num_experts, hidden, intermediate, act, device="cuda"), torch.bfloat16)
    routing = ROUTINGS["qwen3-moe"]
    x = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device="cuda")
    logits = torch.empty(num_tokens, num_experts, dtype=torch.bfloat16, device="cuda")

    def step() -> torch.Tensor:
        weights, ids = moe_route.route(logits, routing, None, use_pdl)
        return fused_moe.fused_experts(x, experts.gate_up_proj, experts.down_proj, weights, ids,
                                       activation(experts.spec), use_pdl=use_pdl)

    x.normal_()
    logits.normal_()
    graph, out = captured(step)
    for seed in range(3):  # new tokens and new routings each replay, as decode steps bring
        generator = torch.Generator("cuda").manual_seed(seed)
        x.copy_(torch.randn(x.shape, device="cuda", generator=generator))
        logits.copy_(torch.randn(logits.shape, device="cuda", generator=generator) * 3)
        graph.replay()
        assert torch.equal(out, step())


def test_row_buckets_are_powers_of_two() -> None:
    assert [row_bucket(n) for n in (1, 2, 3, 16, 17, 512, 513)] == [1, 2, 4, 16, 32, 512, 1024]


def test_no_token_steps_and_top_1() -> None:
    experts = cast(random_experts(8, 64, 32, device="cuda"), torch.bfloat16)
    empty = torch.empty(0, 64, dtype=torch.bfloat16, device="cuda")
    routed = RoutedTokens(torch.empty(0, 2, device="cuda"), torch.empty(0, 2, dtype=torch.int32, device="cuda"))
    assert fused_moe.fused_experts(empty, experts.gate_up_proj, experts.down_proj, routed.weights,
                                   routed.expert_ids, activation(experts.spec)).shape == (0, 64)
    x = torch.randn(9, 64, device="cuda").bfloat16()
    out, reference = kernel_and_reference(random_experts(8, 64, 32, device="cuda"), x, random_routing(9, 8, 1, "cuda"))
    assert_close(out, reference, torch.bfloat16)


@pytest.mark.parametrize("use_pdl", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_kernels_match_the_grouped_gemms_and_the_reference(shape: str, use_pdl: bool) -> None:
    num_experts, top_k, hidden, intermediate, act, has_bias = SHAPES[shape]
    experts = cast(random_experts(num_experts, hidden, intermediate, act, has_bias, device="cuda"), torch.bfloat16)
    reference_experts = cast(experts, torch.float32)
    for num_tokens in (1, 2, 3, 4):
        generator = torch.Generator("cuda").manual_seed(num_tokens)
        x = torch.randn(num_tokens, hidden, device="cuda", generator=generator).bfloat16()
        add = torch.randn(num_tokens, hidden, device="cuda", generator=generator).bfloat16()
        routed = random_routing(num_tokens, num_experts, top_k, "cuda", seed=num_tokens)
        args = (x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                activation(experts.spec), experts.gate_up_proj_bias, experts.down_proj_bias)
        chosen = fused_moe.fused_experts(*args, use_pdl=use_pdl, add=add)  # the decode kernels where the rule says
        grouped = fused_moe.fused_experts(*args, config=config_for(num_tokens, num_experts, top_k, intermediate,
                                                                   hidden), use_pdl=use_pdl, add=add)
        config = fused_moe_configs.decode_config(num_tokens, top_k, intermediate, hidden, torch.cuda.get_device_name())
        decoded = moe_decode.decode_experts(*args, pdl=use_pdl and torch.cuda.get_device_capability()[0] >= 9,
                                            add=add, config=config)
        reference = experts_reference(x.float(), reference_experts,
                                      RoutedTokens(routed.weights, routed.expert_ids.long())) + add.float()
        assert_close(decoded, reference, torch.bfloat16)
        assert_close(grouped, reference, torch.bfloat16)
        assert_close(decoded, grouped.float(), torch.bfloat16)
        if fused_moe_configs.uses_decode_path(num_tokens, top_k, num_experts):
            assert torch.equal(chosen, decoded), (shape, num_tokens)


def test_decode_kernels_are_exact_in_float32() -> None:
    experts = random_experts(128, 2048, 768, "clamped_swiglu", has_bias=True, device="cuda")
    for num_tokens in (1, 4):
        x = torch.randn(num_tokens, 2048, device="cuda")
        routed = random_routing(num_tokens, 128, 8, "cuda", seed=num_tokens)
        out = moe_decode.decode_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights,
                                        routed.expert_ids, activation(experts.spec), experts.gate_up_proj_bias,
                                        experts.down_proj_bias)
        assert_close(out, experts_reference(x, experts, RoutedTokens(routed.weights, routed.expert_ids.long())),
                     torch.float32)


@pytest.mark.parametrize("slot_groups", [None, 4])
@pytest.mark.parametrize("num_tokens", [1, 2])
def test_decode_kernels_in_a_cuda_graph_follow_new_inputs(num_tokens: int, slot_groups: int | None) -> None:
    """With the GPU's tiles, and with the down kernel's slots in groups (float32 partial sums and a second pass)."""
    num_experts, top_k, hidden, intermediate, act, _ = SHAPES["qwen3-30b-a3b"]
    assert fused_moe_configs.uses_decode_path(num_tokens, top_k, num_experts)
    config = None
    if slot_groups is not None:
        rule = fused_moe_configs.default_decode_config(num_tokens, top_k, intermediate, hidden)
        config = fused_moe_configs.DecodeConfig(rule.gate_up, replace(rule.down, slot_groups=slot_groups))
    experts = cast(random_experts(num_experts, hidden, intermediate, act, device="cuda"), torch.bfloat16)
    x = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device="cuda")
    add = torch.empty_like(x)
    logits = torch.empty(num_tokens, num_experts, dtype=torch.bfloat16, device="cuda")

    def step() -> torch.Tensor:
        weights, ids = moe_route.route(logits, ROUTINGS["qwen3-moe"], None, True)
        return fused_moe.fused_experts(x, experts.gate_up_proj, experts.down_proj, weights, ids,
                                       activation(experts.spec), config=config, use_pdl=True, add=add)

    for t in (x, add, logits):
        t.normal_()
    graph, out = captured(step)
    for seed in range(3):
        generator = torch.Generator("cuda").manual_seed(seed)
        for t in (x, add, logits):
            t.copy_(torch.randn(t.shape, device="cuda", generator=generator))
        graph.replay()
        assert torch.equal(out, step())
        weights, ids = moe_route.route(logits, ROUTINGS["qwen3-moe"], None, False)
        reference = experts_reference(x.float(), cast(experts, torch.float32), RoutedTokens(weights, ids.long()))
        assert_close(out, reference + add.float(), torch.bfloat16)


@pytest.mark.parametrize("use_pdl", [False, True])
@pytest.mark.parametrize("name", ROUTINGS)
def test_routing_in_the_gate_up_kernel_equals_the_routing_launch(name: str, use_pdl: bool) -> None:
    """Bit for bit, at every token count the decode path takes: the same ids, weights and output as
    moe_route.route followed by the decode kernels."""
    routing = ROUTINGS[name]
    act, has_bias = ("clamped_swiglu", True) if routing.scoring == "top_k_softmax" else ("silu", False)
    experts = cast(random_experts(routing.num_experts, 1024, 384, act, has_bias, device="cuda"), torch.bfloat16)
    pdl = use_pdl and torch.cuda.get_device_capability()[0] >= 9
    num_tokens = 1
    while fused_moe_configs.uses_decode_path(num_tokens, routing.top_k, routing.num_experts):
        generator = torch.Generator("cuda").manual_seed(num_tokens)
        logits = torch.randn(num_tokens, routing.num_experts, device="cuda", generator=generator) * 2
        logits = logits if routing.float32_logits else logits.bfloat16()
        bias = (torch.randn(routing.num_experts, device="cuda", generator=generator)
                if routing.has_correction_bias else None)
        x = torch.randn(num_tokens, 1024, device="cuda", generator=generator).bfloat16()
        add = torch.randn_like(x)
        args = (x, experts.gate_up_proj, experts.down_proj)
        kwargs = dict(gate_up_bias=experts.gate_up_proj_bias, down_bias=experts.down_proj_bias, pdl=pdl, add=add)
        weights, ids = moe_route.route(logits, routing, bias, pdl)
        expected = moe_decode.decode_experts(*args, weights, ids, activation(experts.spec), **kwargs)
        out, fused_weights, fused_ids = moe_decode.decode_routed_experts(
            *args, moe_decode.RouterLogits(logits, routing, bias), activation(experts.spec), **kwargs)
        assert torch.equal(fused_ids, ids) and torch.equal(fused_weights, weights), (name, num_tokens)
        assert torch.equal(out, expected), (name, num_tokens)
        num_tokens += 1


@pytest.mark.parametrize("num_tokens", [1, 2])
def test_routing_in_the_gate_up_kernel_in_a_cuda_graph_follows_new_logits(num_tokens: int) -> None:
    num_experts, top_k, hidden, intermediate, act, _ = SHAPES["qwen3-30b-a3b"]
    experts = cast(random_experts(num_experts, hidden, intermediate, act, device="cuda"), torch.bfloat16)
    x = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device="cuda")
    logits = torch.empty(num_tokens, num_experts, dtype=torch.bfloat16, device="cuda")
    router = moe_decode.RouterLogits(logits, ROUTINGS["qwen3-moe"], None)

    def step() -> torch.Tensor:
        return fused_moe.fused_routed_experts(x, experts.gate_up_proj, experts.down_proj, router,
                                              activation(experts.spec))

    for t in (x, logits):
        t.normal_()
    graph, out = captured(step)
    for seed in range(3):
        generator = torch.Generator("cuda").manual_seed(seed)
        for t in (x, logits):
            t.copy_(torch.randn(t.shape, device="cuda", generator=generator))
        graph.replay()
        weights, ids = moe_route.route(logits, ROUTINGS["qwen3-moe"], None, True)
        separate = fused_moe.fused_experts(x, experts.gate_up_proj, experts.down_proj, weights, ids,
                                           activation(experts.spec), use_pdl=True)
        assert torch.equal(out, separate)


@pytest.mark.parametrize("name", ["qwen3-moe", "glm-4.5", "gpt-oss"])
def test_experts_route_in_kernel_at_a_decode_step_only_and_match_the_router(name: str) -> None:
    routing = ROUTINGS[name]
    act, has_bias = ("clamped_swiglu", True) if routing.scoring == "top_k_softmax" else ("silu", False)
    experts = cast(random_experts(routing.num_experts, 1024, 384, act, has_bias, device="cuda"), torch.bfloat16)
    router = Router(1024, routing).cuda().bfloat16()
    for param in router.parameters():
        param.data.normal_()
    x = torch.randn(64, 1024, device="cuda").bfloat16()
    assert not experts.routes_in_kernel(router, router.logits(x))
    for num_tokens in (1, 2):
        logits = router.logits(x[:num_tokens])
        if not experts.routes_in_kernel(router, logits):  # gpt-oss: past the decode path at 2 tokens
            assert not fused_moe_configs.uses_decode_path(num_tokens, routing.top_k, routing.num_experts)
            continue
        out = experts.forward_from_logits(x[:num_tokens], router, logits)
        assert torch.equal(out, experts(x[:num_tokens], router.choose(logits)))
