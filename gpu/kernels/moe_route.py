"""Triton kernel: an MoE router's choice of experts from its logits, one launch for every family's rule.

logits [T, E] (any float dtype) -> weights [T, top_k] float32, expert ids [T, top_k] int32, by the rules of
gpu/layers/moe.py's `route_reference` (the torch code it is tested against): softmax scores, or sigmoid scores
with an optional correction bias that only chooses, group-limited (the best `top_k_groups` groups by the sum of
each group's two best choice scores), renormalized or not, scaled; or gpt-oss's softmax over the top k logits.
All in float32. The k experts come out best first; a tie goes to the lower expert id.

Grid: one program per token. The logits are read as [groups, experts per group] (one group without grouping),
each padded to a power of two; the top k are found by k rounds of one max over keys that pack each expert's choice
and id (see `_sortable`), then masking the picked one. Nothing depends on the data but the values written, so a call
is CUDA-graph capturable. `route_row` is that rule for one row, which gpu/kernels/moe_decode.py's gate/up kernel
also runs at a decode step instead of this launch.
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
# A candidate's key: its choice's sortable int32 in the high bits, ID_FIELD - 1 - its expert id in the low ID_BITS.
ID_BITS = tl.constexpr(32)
ID_FIELD = tl.constexpr(1 << 32)
NOT_A_KEY = tl.constexpr(-(1 << 63))  # below every key (-inf's is -0x7F800000 << 32 or more): padding, experts taken


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
    row_ptr = logits_ptr + tl.program_id(0).to(tl.int64) * logits_stride
    weights, ids = route_row(row_ptr, bias_ptr, GROUP_SIZE, NUM_GROUPS, TOP_K_GROUPS, TOP_K, SCORING, RENORMALIZE,
                             EPSILON, HAS_BIAS, SCALE, BLOCK_G, BLOCK_E, BLOCK_K)
    ks = tl.arange(0, BLOCK_K)
    out = tl.program_id(0).to(tl.int64) * TOP_K + ks
    tl.store(weights_ptr + out, weights, mask=ks < TOP_K)
    tl.store(ids_ptr + out, ids, mask=ks < TOP_K)


@triton.jit
def route_row(
    row_ptr, bias_ptr,
    GROUP_SIZE: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOP_K_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr,
    SCORING: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    EPSILON: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """(weights [BLOCK_K] float32, scaled, ids [BLOCK_K] int32) of the row of logits at `row_ptr`: the one rule
    every kernel that routes shares (this file's and gpu/kernels/moe_decode.py's); slots past TOP_K are padding."""
    groups = tl.arange(0, BLOCK_G)
    columns = tl.arange(0, BLOCK_E)
    expert = groups[:, None] * GROUP_SIZE + columns[None, :]  # [BLOCK_G, BLOCK_E]
    is_expert = (groups[:, None] < NUM_GROUPS) & (columns[None, :] < GROUP_SIZE)
    x = tl.load(row_ptr + expert, mask=is_expert, other=float("-inf")).to(tl.float32)
    if SCORING == SOFTMAX:
        top = tl.reduce(tl.reduce(x, 1, maximum), 0, maximum)
        e = tl.where(is_expert, tl.exp(x - top), 0.0)
        scores = e / tl.reduce(tl.reduce(e, 1, add), 0, add)
    elif SCORING == SIGMOID:
        scores = _sigmoid(x)
    else:
        scores = x
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + expert, mask=is_expert, other=0.0).to(tl.float32)
    choice = tl.where(is_expert, choice, float("-inf"))
    if NUM_GROUPS > 1:
        choice = _in_top_groups(choice, columns, groups, TOP_K_GROUPS, BLOCK_E)
    # One max per round: the key orders by choice, then by the lower expert id (torch.topk's pick on a tie), and is
    # unique, so it names the picked expert and, without a bias, carries its weight.
    low = expert.to(tl.int64) ^ (ID_FIELD - 1)  # ID_FIELD - 1 - id: the lower id the larger
    keys = tl.where(is_expert, _sortable(choice).to(tl.int64) * ID_FIELD + low, NOT_A_KEY)
    ks = tl.arange(0, BLOCK_K)
    bests = tl.full([BLOCK_K], NOT_A_KEY, dtype=tl.int64)
    for i in tl.static_range(TOP_K):
        best = tl.reduce(tl.reduce(keys, 1, maximum), 0, maximum)
        bests = tl.where(ks == i, best, bests)
        keys = tl.where(keys == best, NOT_A_KEY, keys)
    is_k = ks < TOP_K
    ids = ((bests & (ID_FIELD - 1)) ^ (ID_FIELD - 1)).to(tl.int32)
    if HAS_BIAS:
        # The bias only chooses: the weight is the picked expert's score, read back from its logit.
        tl.static_assert(SCORING == SIGMOID, "a correction bias goes with sigmoid scores")
        weights = _sigmoid(tl.load(row_ptr + ids, mask=is_k, other=0.0).to(tl.float32))
    else:
        weights = _float_of_sortable((bests >> ID_BITS).to(tl.int32))
    if SCORING == TOP_K_SOFTMAX:
        e = tl.where(is_k, tl.exp(weights - tl.reduce(tl.where(is_k, weights, float("-inf")), 0, maximum)), 0.0)
        weights = e / tl.reduce(e, 0, add)
    elif RENORMALIZE:
        weights = weights / (tl.reduce(tl.where(is_k, weights, 0.0), 0, add) + EPSILON)
    return weights * SCALE, ids


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _sortable(value):
    """float32 `value` as an int32 in the same order: a negative float's magnitude bits negated, so -0.0 and 0.0 are
    equal as torch compares them (not NaN: a router's choices have none)."""
    bits = value.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


@triton.jit
def _float_of_sortable(key):
    """The float32 of `_sortable`'s int32 (0.0 for -0.0)."""
    magnitude = tl.where(key < 0, -key, key).to(tl.float32, bitcast=True)
    return tl.where(key < 0, -magnitude, magnitude)


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
    pdl = uses_pdl(use_pdl, logits)
    _route_kernel[(num_tokens,)](
        logits, correction_bias if correction_bias is not None and routing.scoring == "sigmoid" else logits, weights,
        ids, logits.stride(0), **rule_constants(routing, correction_bias), USE_PDL=pdl, launch_pdl=pdl,
        num_warps=num_warps_for(triton.next_power_of_2(routing.num_groups) *
                                triton.next_power_of_2(routing.num_experts // routing.num_groups)),
    )
    return weights, ids


def rule_constants(routing: "Routing", correction_bias: torch.Tensor | None) -> dict[str, object]:
    """`route_row`'s compile-time arguments for `routing` (gpu/layers/moe.py's Routing)."""
    group_size = routing.num_experts // routing.num_groups
    return dict(
        GROUP_SIZE=group_size, NUM_GROUPS=routing.num_groups, TOP_K_GROUPS=routing.top_k_groups, TOP_K=routing.top_k,
        SCORING=SCORINGS[routing.scoring], RENORMALIZE=routing.renormalize,
        EPSILON=1e-20 if routing.scoring == "sigmoid" else 0.0,
        HAS_BIAS=correction_bias is not None and routing.scoring == "sigmoid", SCALE=float(routing.scaling_factor),
        BLOCK_G=triton.next_power_of_2(routing.num_groups), BLOCK_E=triton.next_power_of_2(group_size),
        BLOCK_K=triton.next_power_of_2(routing.top_k),
    )


def num_warps_for(block_experts: int) -> int:
    """Warps for a row of `block_experts` (padded) experts: one up to 256 (8 keys a thread), so that each top-k
    round's max is warp shuffles alone, with no trip through shared memory between warps; wider rows one more warp
    per 256, up to 4."""
    return min(4, triton.cdiv(block_experts, 256))
