"""Triton kernels: the experts of an MoE block as two grouped GEMMs over a step's (token, slot) pairs sorted by expert.

out[t] = sum_k weights[t, k] * down_e(act(gate_up_e(x[t]))) with e = expert_ids[t, k]; `act` is SiLU-and-mul
(silu(gate) * up) or gpt-oss's clamped SwiGLU ((clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) with
g = min(gate, limit)); optional biases on each expert's gate/up and down products (added before the activation
and before the routing weight).

1. gpu/kernels/moe_align.py sorts the pairs by expert, each expert's run padded to a tile of `block_m` rows.
2. Gate/up: each program takes one tile of rows (one expert) and `block_n` activated columns: it multiplies the
   rows of x those pairs read by the expert's gate rows and by its up rows (two accumulators over the same x
   tile), applies the activation in float32 and writes the intermediate [pairs, intermediate] in the model dtype.
3. Down: the same tiles of pairs times the expert's down weight; each row scaled by its routing weight in float32
   and written to [pairs, hidden]; then gpu/kernels/moe_sum.py sums each token's k rows in float32 (deterministic: no
   atomics) into [tokens, hidden], adding `add` (a shared experts' output) in the same sum where given.
A step of a few tokens with float weights takes gpu/kernels/moe_decode.py's two GEMV kernels instead (no sort,
no separate sum). Sums in float32 (exact float32 products where the weights are float32: no TF32), one rounding per
stored value.
Padded rows (the sentinel pair) are never stored. Weights are [experts, rows, K] with unit stride along K, the
layout of gpu/layers/moe.py's Experts, or MXFP4 (`Mxfp4Weights`, gpu/quant/mxfp4.py): bytes of two e2m1 codes along
K and an e8m0 scale per 32 of K, decoded in the loop to exact values in x's dtype, each byte's two codes multiplied
by x's even and odd columns. Launch parameters: gpu/kernels/fused_moe_configs.py. Every size comes from
the step's shape, so a call is CUDA-graph capturable. With `use_pdl` (Hopper) every kernel is a programmatic
dependent launch (gpu/kernels/pdl.py), as the rest of a decode step's kernels are.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from gpu.kernels.device_tables import device_name
from gpu.kernels.fused_moe_configs import (
    DecodeConfig,
    GemmTiles,
    MoeConfig,
    config_for,
    decode_config,
    uses_decode_path,
)
from gpu.kernels.moe_activation import ACTIVATIONS, activate
from gpu.kernels.moe_align import AlignedPairs, align
from gpu.kernels.moe_decode import RouterLogits, decode_experts, decode_routed_experts
from gpu.kernels.moe_sum import sum_rows
from gpu.kernels.pdl import pdl_start, uses_pdl

if TYPE_CHECKING:
    from gpu.layers.moe import Activation


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, scales_ptr, bias_ptr, c_ptr, weights_ptr, sorted_ptr, block_experts_ptr, num_padded_ptr,
    num_pairs, max_padded, N, K, stride_am, stride_be, stride_bn, stride_se, stride_sn, stride_bias_e, stride_cm,
    PAIRS_PER_ROW: tl.constexpr,  # pairs that read one row of A: top_k for x, 1 for the intermediate
    GATED: tl.constexpr,  # B holds N gate rows then N up rows; the activation of both is stored
    ACTIVATION: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    IEEE: tl.constexpr,  # float32 operands: exact products, no TF32
    MXFP4: tl.constexpr,  # B holds MXFP4 codes, two a byte along K, and an e8m0 scale per 32 of K
    SCALE_ROWS: tl.constexpr,  # > 0: B is FP8 with a float32 scale per block of SCALE_ROWS x SCALE_COLUMNS
    SCALE_COLUMNS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Row tiles in groups of GROUP_M share each column tile in launch order (weights reused from L2).
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    is_pair = pairs < num_pairs
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    columns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    b_columns = columns % N  # columns past N re-read valid ones (never stored): no mask on the weight stream
    if MXFP4:
        acc, acc_up = _mxfp4_products(a_ptr, b_ptr, scales_ptr, pairs // PAIRS_PER_ROW, is_pair, expert, b_columns, N,
                                      K, stride_am, stride_be, stride_bn, stride_se, stride_sn, GATED, IEEE, BLOCK_M,
                                      BLOCK_N, BLOCK_K)
    elif SCALE_ROWS > 0:
        acc, acc_up = _fp8_block_products(a_ptr, b_ptr, scales_ptr, pairs // PAIRS_PER_ROW, is_pair, expert,
                                          b_columns, N, K, stride_am, stride_be, stride_bn, stride_se, stride_sn, GATED,
                                          IEEE, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, SCALE_ROWS, SCALE_COLUMNS)
    else:
        acc, acc_up = _float_products(a_ptr, b_ptr, pairs // PAIRS_PER_ROW, is_pair, expert, b_columns, N, K,
                                      stride_am, stride_be, stride_bn, GATED, IEEE, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        bias_ptrs = bias_ptr + expert * stride_bias_e + b_columns
        acc += tl.load(bias_ptrs).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(bias_ptrs + N).to(tl.float32)[None, :]
    if GATED:
        acc = activate(acc, acc_up, ACTIVATION, ALPHA, LIMIT)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=is_pair, other=0.0)[:, None]
    c_ptrs = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + columns[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=is_pair[:, None] & (columns[None, :] < N))


@triton.jit
def _float_products(a_ptr, b_ptr, a_rows, is_pair, expert, b_columns, N, K, stride_am, stride_be, stride_bn,
                    GATED: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(x tile @ gate (or the whole) rows, x tile @ up rows) over K, float weights."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + expert * stride_be + b_columns.to(tl.int64)[None, :] * stride_bn + ks[:, None]
    up_offset = N * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=is_pair[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=is_pair[:, None] & (ks[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        acc = _dot(a, b, acc, IEEE)
        if GATED:
            if EVEN_K:
                b_up = tl.load(b_ptrs + up_offset)
            else:
                b_up = tl.load(b_ptrs + up_offset, mask=ks[:, None] < K - k * BLOCK_K, other=0.0)
            acc_up = _dot(a, b_up, acc_up, IEEE)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc, acc_up


@triton.jit
def _fp8_block_products(a_ptr, b_ptr, scales_ptr, a_rows, is_pair, expert, b_columns, N, K, stride_am, stride_be,
                        stride_bn, stride_se, stride_sn, GATED: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SCALE_ROWS: tl.constexpr, SCALE_COLUMNS: tl.constexpr):
    """As _float_products over FP8 weights with block scales: each K tile (within one block of columns) multiplied
    with the weights as they are (FP8 values are exact in x's dtype), its float32 sums scaled by each column's block
    scale: no weight rounded. The up rows' scales start N / SCALE_ROWS blocks down (N is whole blocks)."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + expert * stride_be + b_columns.to(tl.int64)[None, :] * stride_bn + ks[:, None]
    s_ptrs = scales_ptr + expert * stride_se + (b_columns // SCALE_ROWS).to(tl.int64) * stride_sn
    up_offset = N * stride_bn
    up_scales = (N // SCALE_ROWS) * stride_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs, mask=is_pair[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=is_pair[:, None] & (ks[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        scale_column = (k * BLOCK_K) // SCALE_COLUMNS
        sums = _dot(a, b.to(a.dtype), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE)
        acc += sums * tl.load(s_ptrs + scale_column)[None, :]
        if GATED:
            if EVEN_K:
                b_up = tl.load(b_ptrs + up_offset)
            else:
                b_up = tl.load(b_ptrs + up_offset, mask=ks[:, None] < k_left, other=0.0)
            sums = _dot(a, b_up.to(a.dtype), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE)
            acc_up += sums * tl.load(s_ptrs + up_scales + scale_column)[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc, acc_up


@triton.jit
def _mxfp4_products(a_ptr, b_ptr, scales_ptr, a_rows, is_pair, expert, b_columns, N, K, stride_am, stride_be,
                    stride_bn, stride_se, stride_sn, GATED: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """As _float_products over MXFP4 weights: each byte's two codes decoded to exact values (code times its block's
    power of two) and multiplied by x's even and odd columns, K in steps of BLOCK_K (a multiple of 32)."""
    HALF: tl.constexpr = BLOCK_K // 2
    bytes_k = tl.arange(0, HALF)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + 2 * bytes_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + b_columns.to(tl.int64)[None, :] * stride_bn + bytes_k[:, None]
    s_ptrs = scales_ptr + expert * stride_se + b_columns.to(tl.int64)[None, :] * stride_sn + (bytes_k // 16)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        in_k = 2 * bytes_k < K - k * BLOCK_K  # (K is a multiple of 32: a byte's two columns are both in or out)
        a_even = tl.load(a_ptrs, mask=is_pair[:, None] & in_k[None, :], other=0.0)
        a_odd = tl.load(a_ptrs + 1, mask=is_pair[:, None] & in_k[None, :], other=0.0)
        codes = tl.load(b_ptrs, mask=in_k[:, None], other=0)
        scales = tl.load(s_ptrs, mask=in_k[:, None], other=127)
        acc = _dot(a_even, _mxfp4_values(codes & 15, scales).to(a_even.dtype), acc, IEEE)
        acc = _dot(a_odd, _mxfp4_values(codes >> 4, scales).to(a_even.dtype), acc, IEEE)
        if GATED:
            codes = tl.load(b_ptrs + N * stride_bn, mask=in_k[:, None], other=0)
            scales = tl.load(s_ptrs + N * stride_sn, mask=in_k[:, None], other=127)
            acc_up = _dot(a_even, _mxfp4_values(codes & 15, scales).to(a_even.dtype), acc_up, IEEE)
            acc_up = _dot(a_odd, _mxfp4_values(codes >> 4, scales).to(a_even.dtype), acc_up, IEEE)
        a_ptrs += BLOCK_K
        b_ptrs += HALF
        s_ptrs += BLOCK_K // 32
    return acc, acc_up


@triton.jit
def _mxfp4_values(codes, scales):
    """e2m1 codes (sign, 2 exponent bits, 1 mantissa bit) times 2^(scale - 127) in float32, exact: the code's bits
    built directly (0.5 for its one subnormal code), the scale's too (2^-127, subnormal, for the scale 0)."""
    codes = codes.to(tl.int32)
    exponent = (codes >> 1) & 3
    bits = tl.where(exponent == 0, (codes & 1) * (126 << 23), ((exponent + 126) << 23) | ((codes & 1) << 22))
    value = (bits | ((codes & 8) << 28)).to(tl.float32, bitcast=True)
    scales = scales.to(tl.int32)
    scale = tl.where(scales == 0, 1 << 22, scales << 23).to(tl.float32, bitcast=True)
    return value * scale


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@dataclass(frozen=True)
class Mxfp4Weights:
    """Stacked expert weights [experts, rows, columns] in MXFP4 (gpu/quant/mxfp4.py): `blocks` uint8 [experts, rows,
    columns / 32, 16] (two codes a byte, the even column's low), `scales` uint8 [experts, rows, columns / 32]."""

    blocks: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        num_experts, rows, groups, _ = self.blocks.shape
        return num_experts, rows, groups * 32


@dataclass(frozen=True)
class Fp8BlockWeights:
    """Stacked expert weights [experts, rows, columns] in FP8 (gpu/quant/fp8_experts.py): `weight` float8_e4m3fn and
    `scales` float32 [experts, ceil(rows / block rows), ceil(columns / block columns)]."""

    weight: torch.Tensor
    scales: torch.Tensor
    block: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.weight.shape)  # type: ignore[return-value]


Weights = torch.Tensor | Mxfp4Weights | Fp8BlockWeights


def fused_experts(x: torch.Tensor, gate_up: Weights, down: Weights, weights: torch.Tensor,
                  expert_ids: torch.Tensor, act: "Activation", gate_up_bias: torch.Tensor | None = None,
                  down_bias: torch.Tensor | None = None, config: MoeConfig | DecodeConfig | None = None,
                  use_pdl: bool = False, add: torch.Tensor | None = None) -> torch.Tensor:
    """sum_k weights[:, k] * expert_{ids[:, k]}(x) [num_tokens, hidden] for x [num_tokens, hidden], gate_up
    [experts, 2 * I, hidden], down [experts, hidden, I], weights [num_tokens, k] float32, expert_ids [num_tokens,
    k]; `act`: gpu/layers/moe.py's Activation; biases [experts, 2 * I] and [experts, hidden]. `config`: the grouped
    GEMMs' tiles, or a DecodeConfig: gpu/kernels/moe_decode.py's GEMVs with its tiles (float weights); None: a step of
    a few tokens with float weights runs the GEMVs (the rule: fused_moe_configs.uses_decode_path), any other the
    grouped GEMMs, either with fused_moe_configs' tiles for the GPU. `use_pdl`:
    programmatic dependent launches; `add` [num_tokens, hidden] contiguous: added to the output in its sum. The
    weights may be `Mxfp4Weights` (both of them; x in bfloat16 or float32), decoded in the GEMMs' loops (K tiles of
    at least 32), or `Fp8BlockWeights` (both; K tiles within one block of columns)."""
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = gate_up.shape
    top_k = expert_ids.shape[1]
    _check(x, gate_up, down, weights, expert_ids)
    if num_tokens == 0:
        return torch.zeros_like(x)
    if add is not None and (add.shape != x.shape or not add.is_contiguous()):
        raise ValueError(f"add must be contiguous of x's shape {tuple(x.shape)}, got {tuple(add.shape)}")
    pdl = uses_pdl(use_pdl, x)
    intermediate = two_i // 2
    if isinstance(config, DecodeConfig) or (config is None and isinstance(gate_up, torch.Tensor)
                                            and uses_decode_path(num_tokens, top_k, num_experts)):
        if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)):
            raise ValueError("the decode kernels take float weights only")
        config = config or decode_config(num_tokens, top_k, intermediate, hidden, device_name(x.device))
        return decode_experts(x, gate_up, down, weights, expert_ids, act, gate_up_bias, down_bias, pdl, add, config)
    if config is None:
        config = config_for(num_tokens, num_experts, top_k, intermediate, hidden, device_name(x.device))
    aligned = align(expert_ids, num_experts, config.block_m, use_pdl=pdl)
    activated = torch.empty(num_tokens * top_k, intermediate, dtype=x.dtype, device=x.device)
    _launch(x, gate_up, gate_up_bias, activated, None, aligned, config, act, top_k, pdl)
    rows = torch.empty(num_tokens * top_k, hidden, dtype=x.dtype, device=x.device)
    _launch(activated, down, down_bias, rows, weights, aligned, config, act, 1, pdl)
    return sum_rows(rows, add, torch.empty_like(x), pdl)


def fused_routed_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, router: RouterLogits,
                         act: "Activation", gate_up_bias: torch.Tensor | None = None,
                         down_bias: torch.Tensor | None = None, add: torch.Tensor | None = None) -> torch.Tensor:
    """`fused_experts` on the decode path of moe_route.route's choice from `router`'s logits, that choice made in
    the gate/up kernel (gpu/kernels/moe_decode.py's `decode_routed_experts`): a step `uses_decode_path` sends there,
    float weights; programmatic dependent launches where the GPU has them."""
    num_tokens, hidden = x.shape
    top_k, intermediate = router.routing.top_k, gate_up.shape[1] // 2
    if not uses_decode_path(num_tokens, top_k, gate_up.shape[0]):
        raise ValueError(f"{num_tokens} tokens of top {top_k} do not take the decode path")
    if add is not None and (add.shape != x.shape or not add.is_contiguous()):
        raise ValueError(f"add must be contiguous of x's shape {tuple(x.shape)}, got {tuple(add.shape)}")
    config = decode_config(num_tokens, top_k, intermediate, hidden, device_name(x.device))
    return decode_routed_experts(x, gate_up, down, router, act, gate_up_bias=gate_up_bias, down_bias=down_bias,
                                 pdl=uses_pdl(True, x), add=add, config=config)[0]


def _launch(a: torch.Tensor, b: Weights, bias: torch.Tensor | None, c: torch.Tensor, weights: torch.Tensor | None,
            aligned: AlignedPairs, config: MoeConfig, act: "Activation", pairs_per_row: int, pdl: bool) -> None:
    is_gated = weights is None
    tiles: GemmTiles = config.gate_up if is_gated else config.down
    is_mxfp4 = isinstance(b, Mxfp4Weights)
    scale_block = b.block if isinstance(b, Fp8BlockWeights) else (0, 0)
    if is_mxfp4:
        tiles = replace(tiles, block_k=max(tiles.block_k, 32))  # a K tile holds whole blocks of 32
        b_values, scales = b.blocks.flatten(2), b.scales  # [E, rows, K / 2] bytes along K, [E, rows, K / 32]
    elif isinstance(b, Fp8BlockWeights):
        tiles = replace(tiles, block_k=min(tiles.block_k, scale_block[1]))  # a K tile within one block of columns
        b_values, scales = b.weight, b.scales
    else:
        b_values = scales = b
    n, k = c.shape[1], a.shape[1]
    max_padded = aligned.sorted_pairs.numel()
    grid = (triton.cdiv(max_padded, config.block_m) * triton.cdiv(n, tiles.block_n),)
    _moe_gemm_kernel[grid](
        a, b_values, scales, bias if bias is not None else b_values, c, weights if weights is not None else c,
        aligned.sorted_pairs, aligned.block_experts, aligned.num_padded, c.shape[0], max_padded, n, k, a.stride(0),
        b_values.stride(0), b_values.stride(1), scales.stride(0), scales.stride(1),
        bias.stride(0) if bias is not None else 0, c.stride(0),
        PAIRS_PER_ROW=pairs_per_row, GATED=is_gated, ACTIVATION=ACTIVATIONS[act.kind], ALPHA=float(act.alpha),
        LIMIT=float(act.limit), HAS_BIAS=bias is not None, MUL_WEIGHT=not is_gated, IEEE=a.dtype == torch.float32,
        MXFP4=is_mxfp4, SCALE_ROWS=scale_block[0], SCALE_COLUMNS=scale_block[1], EVEN_K=k % tiles.block_k == 0,
        BLOCK_M=config.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, USE_PDL=pdl,
        launch_pdl=pdl, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def _check(x: torch.Tensor, gate_up: Weights, down: Weights, weights: torch.Tensor,
           expert_ids: torch.Tensor) -> None:
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = gate_up.shape
    if (gate_up.shape[2] != hidden or two_i % 2 or tuple(down.shape) != (num_experts, hidden, two_i // 2)
            or weights.shape != expert_ids.shape or expert_ids.shape[0] != num_tokens):
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down "
                         f"{tuple(down.shape)}, weights {tuple(weights.shape)}, expert_ids {tuple(expert_ids.shape)}")
    if not weights.is_contiguous() or weights.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError("x needs unit stride along K; weights contiguous float32")
    if isinstance(gate_up, Fp8BlockWeights) or isinstance(down, Fp8BlockWeights):
        _check_fp8_blocks(gate_up, down)
        return
    if isinstance(gate_up, Mxfp4Weights) or isinstance(down, Mxfp4Weights):
        parts = (gate_up, down)
        if not all(isinstance(w, Mxfp4Weights) and w.blocks.is_contiguous() and w.scales.is_contiguous()
                   and w.blocks.dtype == w.scales.dtype == torch.uint8 for w in parts):
            raise ValueError("MXFP4 experts need both weights' blocks and scales contiguous uint8")
        if x.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"MXFP4 experts decode into bfloat16 or float32 activations, not {x.dtype}")
        return
    if gate_up.stride(2) != 1 or down.stride(2) != 1 or x.dtype != gate_up.dtype or x.dtype != down.dtype:
        raise ValueError("x and the experts' weights need unit stride along K and one dtype")


def _check_fp8_blocks(gate_up: Weights, down: Weights) -> None:
    parts = (gate_up, down)
    if not all(isinstance(w, Fp8BlockWeights) and w.weight.dtype == torch.float8_e4m3fn and w.weight.stride(2) == 1
               and w.scales.dtype == torch.float32 and w.scales.is_contiguous() for w in parts):
        raise ValueError("FP8 experts need both weights float8_e4m3fn with unit stride along K and float32 scales")
    rows, columns = gate_up.block  # type: ignore[union-attr]
    if columns & (columns - 1) or gate_up.shape[1] // 2 % rows:
        raise ValueError(f"FP8 experts' scale blocks {(rows, columns)} need a power-of-two width and the gate's "
                         "rows in whole blocks")
