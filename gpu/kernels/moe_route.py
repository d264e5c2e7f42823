"""Triton kernel: an MoE router's choice of experts from its logits, one launch for every family's rule.

logits [T, E] (any float dtype) -> weights [T, top_k] float32, expert ids [T, top_k] int32, by the rules of
gpu/layers/moe.py's `route_reference` (the torch code it is tested against): softmax scores, or sigmoid scores
with an optional correction bias that only chooses, group-limited (the best `top_k_groups` groups by the sum of
each group's two best choice scores), renormalized or not, scaled; or gpt-oss's softmax over the top k logits.
All in float32. The k experts come out best first; a tie goes to the lower expert id.

Grid: one program per token. The logits are read as [groups, experts per group] (one group without grouping),
each padded to a power of two; the top k are found by k rounds of max-and-mask. Nothing depends on the data
but the values written, so a call is CUDA-graph capturable.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.pdl import pdl_start, uses_pdl
from gpu.kernels.triton_math import add, maximum, minimum

if TYPE_CHECKING:
    from gpu.layers.moe import Routing

SOFTMAX = tl.constexpr(0)
SIGMOID = tl.constexpr(1)
TOP_K_SOFTMAX = tl.constexpr(2)
SCORINGS = {"softmax": 0, "sigmoid": 1, "top_k_softmax": 2}


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr, logits_stride,
    GROUP_SIZE: tl.constexpr,  # experts per group (all of them without grouping)
    NUM_GROUPS: tl.constexpr,
    TOP_K_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr,
    SCORING: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    EPSILON: tl.constexpr,  # added to the sum the top k are divided by
    HAS_BIAS: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    groups = tl.arange(0, BLOCK_G)
    columns = tl.arange(0, BLOCK_E)
    expert = groups[:, None] * GROUP_SIZE + columns[None, :]  # [BLOCK_G, BLOCK_E]
    is_expert = (groups[:, None] < NUM_GROUPS) & (columns[None, :] < GROUP_SIZE)
    row_ptr = logits_ptr + tl.program_id(0).to(tl.int64) * logits_stride
    x = tl.load(row_ptr + expert, mask=is_expert, other=float("-inf")).to(tl.float32)
    if SCORING == SOFTMAX:
        top = tl.reduce(tl.reduce(x, 1, maximum), 0, maximum)
        e = tl.where(is_expert, tl.exp(x - top), 0.0)
        scores = e / tl.reduce(tl.reduce(e, 1, add), 0, add)
    elif SCORING == SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-x))
    else:
        scores = x
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + expert, mask=is_expert, other=0.0).to(tl.float32)
    choice = tl.where(is_expert, choice, float("-inf"))
    if NUM_GROUPS > 1:
        choice = _in_top_groups(choice, columns, groups, TOP_K_GROUPS, BLOCK_E)
    ks = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.reduce(tl.reduce(choice, 1, maximum), 0, maximum)
        # The lowest expert id among those at the best choice (torch.topk's pick on a tie).
        picked = tl.reduce(tl.reduce(tl.where(choice == best, expert, 1 << 30), 1, minimum), 0, minimum)
        weight = tl.reduce(tl.reduce(tl.where(expert == picked, scores, 0.0), 1, add), 0, add)
        weights = tl.where(ks == i, weight, weights)
        ids = tl.where(ks == i, picked, ids)
        choice = tl.where(expert == picked, float("-inf"), choice)
    is_k = ks < TOP_K
    if SCORING == TOP_K_SOFTMAX:
        e = tl.where(is_k, tl.exp(weights - tl.reduce(tl.where(is_k, weights, float("-inf")), 0, maximum)), 0.0)
        weights = e / tl.reduce(e, 0, add)
    elif RENORMALIZE:
        weights = weights / (tl.reduce(tl.where(is_k, weights, 0.0), 0, add) + EPSILON)
    out = tl.program_id(0).to(tl.int64) * TOP_K + ks
    tl.store(weights_ptr + out, weights * SCALE, mask=is_k)
    tl.store(ids_ptr + out, ids, mask=is_k)


@triton.jit
def _in_top_groups(choice, columns, groups, TOP_K_GROUPS: tl.constexpr, BLOCK_E: tl.constexpr):
    """`choice` [BLOCK_G, BLOCK_E] with the experts outside the best TOP_K_GROUPS groups at -inf; a group's score is
    the sum of its two best choices."""
    first = tl.reduce(choice, 1, maximum)
    first_column = tl.reduce(tl.where(choice == first[:, None], columns[None, :], BLOCK_E), 1, minimum)
    second = tl.reduce(tl.where(columns[None, :] == first_column[:, None], float("-inf"), choice), 1, maximum)
    group_scores = first + second  # [BLOCK_G]; padded groups: -inf
    is_chosen = groups < 0
    for _ in tl.static_range(TOP_K_GROUPS):
        best = tl.reduce(group_scores, 0, maximum)
        picked = tl.reduce(tl.where(group_scores == best, groups, 1 << 30), 0, minimum)
        is_chosen = is_chosen | (groups == picked)
        group_scores = tl.where(groups == picked, float("-inf"), group_scores)
    return tl.where(is_chosen[:, None], choice, float("-inf"))


def route(logits: torch.Tensor, routing: "Routing", correction_bias: torch.Tensor | None, use_pdl: bool = False
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k] float32, expert ids [T, top_k] int32) of logits [T, num_experts]; `routing` is
    gpu/layers/moe.py's Routing; `use_pdl`: a programmatic dependent launch where the GPU has it."""
    num_tokens, num_experts = logits.shape
    if num_experts != routing.num_experts or logits.stride(1) != 1:
        raise ValueError(f"logits must be [num_tokens, {routing.num_experts}] with unit stride along the experts, "
                         f"got {tuple(logits.shape)} strides {logits.stride()}")
    k = routing.top_k
    weights = torch.empty(num_tokens, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, k, dtype=torch.int32, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    group_size = num_experts // routing.num_groups
    has_bias = correction_bias is not None and routing.scoring == "sigmoid"
    pdl = uses_pdl(use_pdl, logits)
    _route_kernel[(num_tokens,)](
        logits, correction_bias if has_bias else logits, weights, ids, logits.stride(0),
        GROUP_SIZE=group_size, NUM_GROUPS=routing.num_groups, TOP_K_GROUPS=routing.top_k_groups, TOP_K=k,
        SCORING=SCORINGS[routing.scoring], RENORMALIZE=routing.renormalize,
        EPSILON=1e-20 if routing.scoring == "sigmoid" else 0.0, HAS_BIAS=has_bias,
        SCALE=float(routing.scaling_factor), BLOCK_G=triton.next_power_of_2(routing.num_groups),
        BLOCK_E=triton.next_power_of_2(group_size), BLOCK_K=triton.next_power_of_2(k), USE_PDL=pdl, launch_pdl=pdl,
        num_warps=1 if num_experts <= 64 else 4,
    )
    return weights, ids
