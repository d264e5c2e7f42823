"""Inputs and torch references shared by the MoE kernels' tests (interpreted on the CPU and on CUDA)."""

import math
from typing import TYPE_CHECKING

import torch

from gpu.layers.moe import Activation, Experts, MoeSpec, RoutedTokens, Routing, activation, experts_reference

if TYPE_CHECKING:
    from gpu.kernels.fused_moe_configs import MoeConfig

ACTIVATIONS = {"silu": Activation("silu"), "clamped_swiglu": Activation("clamped_swiglu", 1.702, 7.0)}


def random_experts(num_experts: int, hidden: int, intermediate: int, act: str = "silu", has_bias: bool = False,
                   device: str = "cpu", seed: int = 0) -> Experts:
    """float32 stacked experts with random weights scaled so that products stay near 1."""
    spec = MoeSpec(Routing(num_experts, 1), intermediate, ACTIVATIONS[act].kind, ACTIVATIONS[act].alpha or 1.702,
                   ACTIVATIONS[act].limit or 7.0, has_expert_bias=has_bias)
    experts = Experts(hidden, spec).to(device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, param in experts.named_parameters():
            scale = 0.5 if "bias" in name else 2 * param.shape[-1] ** -0.5
            param.copy_(torch.randn(param.shape, generator=generator, device=device) * scale)
    return experts


def cast(experts: Experts, dtype: torch.dtype) -> Experts:
    """A copy of `experts` with every weight rounded to `dtype`."""
    copy = Experts(experts.gate_up_proj.shape[2], experts.spec).to(experts.gate_up_proj.device)
    with torch.no_grad():
        for mine, theirs in zip(copy.parameters(), experts.parameters(), strict=True):
            mine.copy_(theirs)
    return copy.to(dtype)


def random_routing(num_tokens: int, num_experts: int, top_k: int, device: str = "cpu", seed: int = 0,
                   skewed: bool = False) -> RoutedTokens:
    """Distinct experts per token with positive float32 weights; `skewed`: most tokens on the same few experts."""
    generator = torch.Generator(device).manual_seed(seed)
    scores = torch.rand(num_tokens, num_experts, generator=generator, device=device)
    if skewed:
        scores[:, : max(top_k, 2)] += 1.0
    ids = scores.topk(top_k, dim=-1).indices.to(torch.int32)
    return RoutedTokens(torch.rand(num_tokens, top_k, generator=generator, device=device) + 0.1, ids)


def lowest_ids_first(logits: torch.Tensor, routing: Routing, bias: torch.Tensor | None) -> torch.Tensor:
    """The top k experts by the rule gpu/kernels/moe_route.py promises: the best choice first, a tie to the lower
    expert id (a stable sort), within the best groups (a tie there to the lower group id too)."""
    if routing.scoring == "softmax":
        choice = torch.softmax(logits.float(), dim=-1)
    elif routing.scoring == "sigmoid":
        choice = logits.float().sigmoid() + (0.0 if bias is None else bias)
    else:
        choice = logits.float()
    grouped = choice.view(choice.shape[0], routing.num_groups, -1)
    group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1) if routing.num_groups > 1 else grouped[..., 0]
    best_groups = torch.sort(-group_scores, dim=-1, stable=True)[1][:, : routing.top_k_groups]
    is_best = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    choice = grouped.masked_fill(~is_best.unsqueeze(-1), float("-inf")).view_as(choice)
    return torch.sort(-choice, dim=-1, stable=True)[1][:, : routing.top_k]


def kernel_and_reference(experts: Experts, x: torch.Tensor, routed: RoutedTokens,
                         config: "MoeConfig | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the fused kernels' output for x in x's dtype, the torch reference's in float32 on the same rounded weights
    and inputs); `config`: the grouped GEMMs' tiles (None: fused_experts's own choice, the decode kernels at a few
    tokens)."""
    from gpu.kernels.fused_moe import fused_experts

    torch.set_grad_enabled(False)
    ours = cast(experts, x.dtype)
    out = fused_experts(x, ours.gate_up_proj, ours.down_proj, routed.weights, routed.expert_ids,
                        activation(ours.spec), ours.gate_up_proj_bias, ours.down_proj_bias, config)
    reference = experts_reference(x.float(), cast(ours, torch.float32),
                                  RoutedTokens(routed.weights, routed.expert_ids.long()))
    return out, reference


def aligned_reference(expert_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[list[list[int]], list[int]]:
    """(each padded tile's pairs, with the sentinel (the number of pairs) as padding; each tile's expert), as a
    stable sort by expert gives them."""
    flat = expert_ids.flatten().tolist()
    tiles: list[list[int]] = []
    tile_experts: list[int] = []
    for expert in range(num_experts):
        pairs = [p for p, e in enumerate(flat) if e == expert]
        for start in range(0, len(pairs), block_m):
            tile = pairs[start : start + block_m]
            tiles.append(tile + [len(flat)] * (block_m - len(tile)))
            tile_experts.append(expert)
    return tiles, tile_experts


def random_mxfp4_experts(num_experts: int, hidden: int, intermediate: int, act: str = "clamped_swiglu",
                         has_bias: bool = True, device: str = "cpu", seed: int = 0) -> Experts:
    """Stacked experts in MXFP4 (gpu/quant/mxfp4.py's stored form): every code at random, each block's scale near the
    one that keeps products near 1."""
    from gpu.quant.mxfp4 import Mxfp4ExpertsMethod

    spec = MoeSpec(Routing(num_experts, 1), intermediate, ACTIVATIONS[act].kind, ACTIVATIONS[act].alpha or 1.702,
                   ACTIVATIONS[act].limit or 7.0, has_expert_bias=has_bias, is_gpt_oss_layout=True)
    experts = Experts(hidden, spec)
    experts.use_quant_method(Mxfp4ExpertsMethod())
    experts.to(device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, param in experts.named_parameters():
            if name.endswith("_blocks"):
                param.copy_(torch.randint(0, 256, param.shape, generator=generator, device=device))
            elif name.endswith("_scales"):  # values up to 6 * 2^(s - 127) with ~sqrt(columns) terms a sum
                centre = 127 - 2 - round(0.5 * math.log2(param.shape[-1] * 32))
                param.copy_(torch.randint(centre - 1, centre + 2, param.shape, generator=generator, device=device))
            else:
                param.copy_(torch.randn(param.shape, generator=generator, device=device) * 0.5)
    return experts


def random_fp8_experts(num_experts: int, hidden: int, intermediate: int, block: tuple[int, int], act: str = "silu",
                       has_bias: bool = False, device: str = "cpu", seed: int = 0) -> Experts:
    """Stacked experts in FP8 with block scales (gpu/quant/fp8_experts.py's stored form): FP8 values across their
    range, each block's scale at random near the one that keeps products near 1."""
    from gpu.quant.fp8_experts import Fp8BlockExpertsMethod

    spec = MoeSpec(Routing(num_experts, 1), intermediate, ACTIVATIONS[act].kind, ACTIVATIONS[act].alpha or 1.702,
                   ACTIVATIONS[act].limit or 7.0, has_expert_bias=has_bias)
    experts = Experts(hidden, spec)
    experts.use_quant_method(Fp8BlockExpertsMethod(block))
    experts.to(device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            weight, scales = getattr(experts, name), getattr(experts, f"{name}_scale_inv")
            levels = torch.randn(weight.shape, generator=generator, device=device) * 100
            weight.copy_(levels.clamp(-448, 448).to(weight.dtype))
            spread = 2 * weight.shape[-1] ** -0.5 / 100
            scales.copy_((torch.rand(scales.shape, generator=generator, device=device) + 0.5) * spread)
        for bias in (experts.gate_up_proj_bias, experts.down_proj_bias):
            if bias is not None:
                bias.copy_(torch.randn(bias.shape, generator=generator, device=device) * 0.5)
    return experts


def quantized_kernel_and_reference(experts: Experts, x: torch.Tensor, routed: RoutedTokens
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the quantized experts' method's output for x in x's dtype (its fused kernels), the torch reference's in
    float32 on their exact dequantization and the same inputs; the biases rounded to x's dtype first, as a served
    model holds them)."""
    torch.set_grad_enabled(False)
    for bias in (experts.gate_up_proj_bias, experts.down_proj_bias):
        if bias is not None:
            bias.data = bias.data.to(x.dtype)
    assert experts.quant is not None
    out = experts.quant(experts, x, routed, None)
    gate_up, down = experts.quant.dequantize(experts)
    reference = Experts(experts.hidden_size, experts.spec).to(x.device)
    with torch.no_grad():
        reference.gate_up_proj.copy_(gate_up)
        reference.down_proj.copy_(down)
        if experts.gate_up_proj_bias is not None:
            reference.gate_up_proj_bias.copy_(experts.gate_up_proj_bias)
            reference.down_proj_bias.copy_(experts.down_proj_bias)
    expected = experts_reference(x.float(), reference, RoutedTokens(routed.weights, routed.expert_ids.long()))
    return out, expected
