"""Triton kernels: an MoE block's experts at a decode step's few tokens, as one GEMV per (token, slot) pair.

The same sums as gpu/kernels/fused_moe.py (out[t] = sum_k weights[t, k] * down_e(act(gate_up_e(x[t]))) with
e = expert_ids[t, k], biases added before the activation and before the routing weight), in two launches where the
grouped path takes four: no sort of the pairs by expert (each pair reads its expert id from the router's output)
and no separate sum over each token's rows. Given the router's logits (`decode_routed_experts`), no routing launch
either: each gate/up program routes its token's row by moe_route.py's `route_row` (the one rule) and takes its slot,
and column block 0's programs store the ids and weights the down kernel reads.

1. Gate/up: one program per (pair, block of `block_n` activated columns): that expert's gate rows and up rows times
   the pair's row of x in float32, GEMV-shaped (a weight tile times x broadcast, the products summed elementwise over
   the K tiles and reduced across K once; tl.dot would need a row tile of 16 for one row, and at one row the kernel
   is bound by the weight stream, which the vector form reads in full 16-byte loads), the activation applied,
   stored [pairs, intermediate] in x's dtype (where transformers rounds it).
2. Down: one program per (token, block of `block_n` hidden columns): over the token's top k experts in slot order,
   that expert's down rows times the pair's intermediate row scaled by its routing weight, and its bias times the
   weight, summed in float32 (deterministic: no atomics), plus `add` (a shared experts' output) where given; one
   rounding. With `slot_groups` > 1 a token's slots are split over that many programs per column tile (at one token
   a column tile alone leaves few programs, each streaming every slot's rows), each storing its group's float32 sum;
   gpu/kernels/moe_sum.py then adds the groups in order, and `add`.

K (a model's size) is a compile-time constant, and x's or the intermediate's row is read in the weight tile's own
layout (a broadcast load, from L1): no exchange through shared memory between the loads, so a program's loads (all
its slots' in the down kernel) may all be in flight at once. With `num_stages` > 1 the K loop is software-pipelined
instead: the next K tiles' loads go to shared memory asynchronously (Triton pipelines loads that feed no tl.dot only
where the loop asks for stages). Products in float32 on the weights as stored (float32 weights: exact products, no
TF32). Float weights only (the quantized formats run the grouped path). Every size comes from the step's shape, so a
call is CUDA-graph capturable; with `use_pdl` each kernel is a programmatic dependent launch (gpu/kernels/pdl.py).
Tiles: gpu/kernels/fused_moe_configs.py's `decode_config` (its table's or the rule's); which steps come here: its
`uses_decode_path`.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.fused_moe_configs import DecodeConfig, default_decode_config
from gpu.kernels.moe_activation import ACTIVATIONS, activate
from gpu.kernels.moe_route import route_row, rule_constants
from gpu.kernels.moe_sum import sum_rows
from gpu.kernels.pdl import pdl_start
from gpu.kernels.triton_math import add, maximum

if TYPE_CHECKING:
    from gpu.layers.moe import Activation, Routing


@dataclass(frozen=True)
class RouterLogits:
    """A step's router output before the choice of experts, for the gate/up kernel to route from."""

    logits: torch.Tensor  # [num_tokens, num_experts], unit stride along the experts
    routing: "Routing"
    correction_bias: torch.Tensor | None


@triton.jit
def _load_k(ptrs, is_k, EVEN_K: tl.constexpr):
    """A tile along K (the last axis) in float32, columns of K past its end read as 0."""
    if EVEN_K:
        return tl.load(ptrs).to(tl.float32)
    return tl.load(ptrs, mask=is_k, other=0.0).to(tl.float32)


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, bias_ptr, ids_ptr, out_ptr, N, stride_x, stride_we, stride_wn, stride_bias_e,
    logits_ptr, route_bias_ptr, route_weights_ptr, stride_logits,
    FUSES_ROUTING: tl.constexpr,  # route here (moe_route.py's rule) and write ids and weights, rather than read ids
    GROUP_SIZE: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOP_K_GROUPS: tl.constexpr,
    SCORING: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    EPSILON: tl.constexpr,
    HAS_ROUTE_BIAS: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_SLOTS: tl.constexpr,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    ACTIVATION: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """out[pair, n] = act(gate_e[n] . x[token] (+ bias), up_e[n] . x[token] (+ bias)), e = ids[pair]; with
    FUSES_ROUTING, e is the pair's slot of its token's routing, which column block 0 stores in ids and weights."""
    pdl_start(USE_PDL)
    pair = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_columns = (columns % N).to(tl.int64)  # columns past N re-read valid ones (never stored): no mask on the weights
    if FUSES_ROUTING:
        # Every column block routes its token's row again: a row of logits is a few hundred bytes, and a launch
        # saved is worth more than the repeat.
        row_ptr = logits_ptr + (pair // TOP_K).to(tl.int64) * stride_logits
        weights, ids = route_row(row_ptr, route_bias_ptr, GROUP_SIZE, NUM_GROUPS, TOP_K_GROUPS, TOP_K, SCORING,
                                 RENORMALIZE, EPSILON, HAS_ROUTE_BIAS, SCALE, BLOCK_G, BLOCK_E, BLOCK_SLOTS)
        is_slot = tl.arange(0, BLOCK_SLOTS) == pair % TOP_K
        expert = tl.reduce(tl.where(is_slot, ids, 0), 0, add).to(tl.int64)
        is_first_block = tl.program_id(1) == 0
        tl.store(ids_ptr + pair, expert.to(tl.int32), mask=is_first_block)
        weight = tl.reduce(tl.where(is_slot, weights, float("-inf")), 0, maximum)
        tl.store(route_weights_ptr + pair, weight, mask=is_first_block)
    else:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x + ks
    w_ptrs = w_ptr + expert * stride_we + w_columns[:, None] * stride_wn + ks[None, :]
    up_offset = N * stride_wn
    # Products summed elementwise over the K tiles, reduced across K once at the end.
    gate_sums = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    up_sums = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        is_k = ks < K - k
        x = _load_k(tl.broadcast_to(x_ptrs[None, :], (BLOCK_N, BLOCK_K)), is_k[None, :], EVEN_K)
        gate_sums += _load_k(w_ptrs, is_k[None, :], EVEN_K) * x
        up_sums += _load_k(w_ptrs + up_offset, is_k[None, :], EVEN_K) * x
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    gate = tl.reduce(gate_sums, 1, add)
    up = tl.reduce(up_sums, 1, add)
    if HAS_BIAS:
        bias_ptrs = bias_ptr + expert * stride_bias_e + w_columns
        gate += tl.load(bias_ptrs).to(tl.float32)
        up += tl.load(bias_ptrs + N).to(tl.float32)
    out = activate(gate, up, ACTIVATION, ALPHA, LIMIT)
    tl.store(out_ptr + pair.to(tl.int64) * N + columns, out.to(out_ptr.dtype.element_ty), mask=columns < N)


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, bias_ptr, ids_ptr, weights_ptr, add_ptr, out_ptr, N, stride_we, stride_wn, stride_bias_e,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_ADD: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SLOT_GROUPS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """out[t, n] = (add[t, n] +) sum_k weights[t, k] * (down_e[n] . h[t * TOP_K + k] (+ bias_e[n])), e = ids[t, k];
    with SLOT_GROUPS > 1, out[t * SLOT_GROUPS + g, n] = that sum over group g's slots (program axis 2), no add."""
    pdl_start(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    group = tl.program_id(2)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_columns = (columns % N).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    # Each slot's products, its routing weight applied to its intermediate row, summed elementwise over the slots
    # and K tiles, reduced across K once at the end; the biases, weighted, beside them.
    sums = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    biases = tl.zeros([BLOCK_N], dtype=tl.float32)
    for slot in tl.static_range(TOP_K // SLOT_GROUPS):
        pair = token * TOP_K + group * (TOP_K // SLOT_GROUPS) + slot
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        weight = tl.load(weights_ptr + pair)
        h_ptrs = h_ptr + pair * K + ks
        w_ptrs = w_ptr + expert * stride_we + w_columns[:, None] * stride_wn + ks[None, :]
        for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            is_k = ks < K - k
            h = _load_k(tl.broadcast_to(h_ptrs[None, :], (BLOCK_N, BLOCK_K)), is_k[None, :], EVEN_K)
            sums += _load_k(w_ptrs, is_k[None, :], EVEN_K) * (h * weight)
            h_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            biases += weight * tl.load(bias_ptr + expert * stride_bias_e + w_columns).to(tl.float32)
    out = tl.reduce(sums, 1, add) + biases
    is_column = columns < N
    if HAS_ADD:
        out += tl.load(add_ptr + token * N + columns, mask=is_column, other=0.0).to(tl.float32)
    row = token * SLOT_GROUPS + group
    tl.store(out_ptr + row * N + columns, out.to(out_ptr.dtype.element_ty), mask=is_column)


def decode_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
                   expert_ids: torch.Tensor, act: "Activation", gate_up_bias: torch.Tensor | None = None,
                   down_bias: torch.Tensor | None = None, pdl: bool = False, add: torch.Tensor | None = None,
                   config: DecodeConfig | None = None, router: RouterLogits | None = None) -> torch.Tensor:
    """fused_moe.fused_experts's output for the same arguments (checked there) with float weights; `pdl`: launch
    with programmatic dependent launches (already resolved for the device); `config`: the kernels' tiles (None: the
    rule's, gpu/kernels/fused_moe_configs.py's `default_decode_config`); `router`: route from its logits inside the
    gate/up kernel, writing `weights` and `expert_ids` (contiguous, float32 and int32) instead of reading them."""
    num_tokens, hidden = x.shape
    intermediate = gate_up.shape[1] // 2
    top_k = expert_ids.shape[1]
    config = config or default_decode_config(num_tokens, top_k, intermediate, hidden)
    if top_k % config.down.slot_groups:
        raise ValueError(f"slot_groups {config.down.slot_groups} does not divide top k {top_k}")
    ids = expert_ids.contiguous()
    if router is not None and not (ids is expert_ids and weights.is_contiguous() and ids.dtype == torch.int32):
        raise ValueError("routing in the kernel needs contiguous int32 expert_ids and contiguous weights to write")
    activated = torch.empty(num_tokens * top_k, intermediate, dtype=x.dtype, device=x.device)
    tiles = config.gate_up
    _gate_up_kernel[(num_tokens * top_k, triton.cdiv(intermediate, tiles.block_n))](
        x, gate_up, gate_up_bias if gate_up_bias is not None else gate_up, ids, activated, intermediate, x.stride(0),
        gate_up.stride(0), gate_up.stride(1), gate_up_bias.stride(0) if gate_up_bias is not None else 0,
        *_routing_arguments(router, weights), K=hidden,
        TOP_K=top_k, ACTIVATION=ACTIVATIONS[act.kind], ALPHA=float(act.alpha), LIMIT=float(act.limit),
        HAS_BIAS=gate_up_bias is not None, EVEN_K=hidden % tiles.block_k == 0, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, NUM_STAGES=tiles.num_stages, USE_PDL=pdl, launch_pdl=pdl, num_warps=tiles.num_warps,
    )
    out = torch.empty_like(x)
    tiles = config.down
    groups = tiles.slot_groups
    # Slot groups: each group's float32 sum, summed by gpu/kernels/moe_sum.py (with `add`) into out.
    sums = out if groups == 1 else torch.empty(num_tokens * groups, hidden, dtype=torch.float32, device=x.device)
    _down_kernel[(num_tokens, triton.cdiv(hidden, tiles.block_n), groups)](
        activated, down, down_bias if down_bias is not None else down, ids, weights,
        add if add is not None and groups == 1 else sums, sums, hidden, down.stride(0), down.stride(1),
        down_bias.stride(0) if down_bias is not None else 0, K=intermediate, TOP_K=top_k,
        HAS_BIAS=down_bias is not None, HAS_ADD=add is not None and groups == 1,
        EVEN_K=intermediate % tiles.block_k == 0, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, SLOT_GROUPS=groups,
        NUM_STAGES=tiles.num_stages, USE_PDL=pdl, launch_pdl=pdl, num_warps=tiles.num_warps,
    )
    return out if groups == 1 else sum_rows(sums, add, out, pdl)


def decode_routed_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, router: RouterLogits,
                          act: "Activation", **kwargs: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, weights [T, top_k] float32, expert ids [T, top_k] int32): moe_route.route's choice and
    `decode_experts`'s output of it, with no routing launch; `kwargs`: decode_experts's keyword arguments."""
    num_tokens, top_k = x.shape[0], router.routing.top_k
    logits = router.logits
    if logits.shape != (num_tokens, router.routing.num_experts) or logits.stride(1) != 1:
        raise ValueError(f"logits must be [{num_tokens}, {router.routing.num_experts}] with unit stride along the "
                         f"experts, got {tuple(logits.shape)} strides {logits.stride()}")
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=x.device)
    out = decode_experts(x, gate_up, down, weights, ids, act, router=router, **kwargs)  # type: ignore[arg-type]
    return out, weights, ids


def _routing_arguments(router: RouterLogits | None, weights: torch.Tensor) -> list[object]:
    """The gate/up kernel's routing arguments (logits, bias, weights out, logits' row stride, then the rule's
    compile-time ones), placeholders without `router`."""
    if router is None:
        return [weights, weights, weights, 0, False, 1, 1, 1, 0, False, 0.0, False, 1.0, 1, 1, 1]
    constants = rule_constants(router.routing, router.correction_bias)
    bias = router.correction_bias if constants["HAS_BIAS"] else router.logits
    return [router.logits, bias, weights, router.logits.stride(0), True, constants["GROUP_SIZE"],
            constants["NUM_GROUPS"], constants["TOP_K_GROUPS"], constants["SCORING"], constants["RENORMALIZE"],
            constants["EPSILON"], constants["HAS_BIAS"], constants["SCALE"], constants["BLOCK_G"],
            constants["BLOCK_E"], constants["BLOCK_K"]]
