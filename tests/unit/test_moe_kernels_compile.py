"""The MoE kernels compiled for Hopper (sm_90) on the CPU, by Triton's own compiler and ptxas (no GPU needed): every
config the tile rule gives, at the real shapes of the MoE families, fits in an H100's shared memory and runs without
spilling registers, the GEMMs' loads are pipelined (more than one stage of shared memory), and the decode kernels
read their tiles in 16-byte loads (through shared memory only where a tile asks for pipeline stages). Arguments are
specialized as a launch on a GPU would specialize them (pointers 16-byte aligned; sizes and strides that are
multiples of 16 marked so), which is what lets the compiler pipeline the loads."""

import re
import subprocess
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gpu.kernels import fused_moe, moe_align, moe_decode, moe_route, moe_sum  # noqa: E402
from gpu.kernels.fused_moe_configs import decode_tiles, default_config, uses_decode_path  # noqa: E402
from gpu.layers.moe import Routing  # noqa: E402

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
if not CUOBJDUMP.exists():
    pytest.skip("triton without its NVIDIA backend's tools", allow_module_level=True)

HOPPER = GPUTarget("cuda", 90, 32)
MAX_SHARED = 227 * 1024  # an H100's shared memory per block
MULTIPLES_OF_16 = {"K", "N", "stride_am", "stride_be", "stride_bn", "stride_bias_e", "stride_cm", "logits_stride",
                   "stride_x", "stride_we", "stride_wn"}
# (experts, top_k, hidden, intermediate per rank, clamped SwiGLU with biases)
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, False), "gpt-oss-20b": (32, 4, 2880, 2880, True),
          "mixtral-8x7b": (8, 2, 4096, 14336, False), "glm-4.5-air": (128, 8, 4096, 1408, False)}


def compile_for_hopper(fn: object, signature: dict[str, str], constants: dict[str, object], num_warps: int,
                       num_stages: int = 3) -> object:
    names = list(signature)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if signature[name].startswith("*") or name in MULTIPLES_OF_16}
    source = ASTSource(fn=fn, signature=signature | {k: "constexpr" for k in constants}, constexprs=constants,
                       attrs=attrs)
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})


def compiled(fn: object, signature: dict[str, str], constants: dict[str, object], num_warps: int,
             num_stages: int = 3) -> tuple[int, int, int]:
    """(registers, spilled bytes, shared bytes) of `fn` compiled for sm_90 (the MoE GEMM with float weights unless
    `constants` name a format)."""
    if fn is fused_moe._moe_gemm_kernel:
        constants = FLOAT_WEIGHTS | constants
    kernel = compile_for_hopper(fn, signature, constants, num_warps, num_stages)
    cubin = Path(f"/tmp/moe-compile-{kernel.metadata.hash}.cubin")
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    cubin.unlink()
    registers, stack = (int(x) for x in re.search(r"REG:(\d+).*?STACK:(\d+)", usage, re.S).groups())
    return registers, stack, kernel.metadata.shared


FLOAT_WEIGHTS = dict(MXFP4=False, SCALE_ROWS=0, SCALE_COLUMNS=0)
GEMM_SIGNATURE = {"a_ptr": "*bf16", "b_ptr": "*bf16", "scales_ptr": "*bf16", "bias_ptr": "*bf16", "c_ptr": "*bf16",
                  "weights_ptr": "*fp32", "sorted_ptr": "*i32", "block_experts_ptr": "*i32", "num_padded_ptr": "*i32",
                  "num_pairs": "i32", "max_padded": "i32", "N": "i32", "K": "i32", "stride_am": "i32",
                  "stride_be": "i32", "stride_bn": "i32", "stride_se": "i32", "stride_sn": "i32",
                  "stride_bias_e": "i32", "stride_cm": "i32"}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_bucket_config_fits_and_pipelines(shape: str) -> None:
    num_experts, top_k, hidden, intermediate, is_gpt_oss = SHAPES[shape]
    configs = {default_config(1 << b, num_experts, top_k) for b in range(14)}  # 1 .. 8192 tokens
    for config in configs:
        for is_gated, tiles, k in ((True, config.gate_up, hidden), (False, config.down, intermediate)):
            constants = dict(PAIRS_PER_ROW=top_k if is_gated else 1, GATED=is_gated, ACTIVATION=int(is_gpt_oss),
                             ALPHA=1.702, LIMIT=7.0, HAS_BIAS=is_gpt_oss, MUL_WEIGHT=not is_gated, IEEE=False,
                             EVEN_K=k % tiles.block_k == 0, BLOCK_M=config.block_m, BLOCK_N=tiles.block_n,
                             BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, USE_PDL=True)
            _, spilled, shared = compiled(fused_moe._moe_gemm_kernel, GEMM_SIGNATURE, constants, tiles.num_warps,
                                          tiles.num_stages)
            one_stage = 2 * tiles.block_k * (config.block_m + tiles.block_n * (2 if is_gated else 1))
            assert spilled == 0 and shared <= MAX_SHARED, (config, is_gated, spilled, shared)
            assert shared >= 2 * one_stage, f"loads not pipelined: {config} gated={is_gated} shared {shared}"


def test_mxfp4_gemm_fits_every_bucket_config_at_gpt_oss_shape() -> None:
    """gpt-oss-20b's MXFP4 experts: bytes of codes and scales for B, decoded in the loop, K tiles of at least 32."""
    num_experts, top_k, hidden, intermediate, _ = SHAPES["gpt-oss-20b"]
    signature = GEMM_SIGNATURE | {"b_ptr": "*u8", "scales_ptr": "*u8"}
    configs = {default_config(1 << b, num_experts, top_k) for b in range(14)}
    for config in configs:
        for is_gated, tiles, k in ((True, config.gate_up, hidden), (False, config.down, intermediate)):
            block_k = max(tiles.block_k, 32)
            constants = dict(PAIRS_PER_ROW=top_k if is_gated else 1, GATED=is_gated, ACTIVATION=1, ALPHA=1.702,
                             LIMIT=7.0, HAS_BIAS=True, MUL_WEIGHT=not is_gated, IEEE=False, MXFP4=True,
                             EVEN_K=k % block_k == 0, BLOCK_M=config.block_m, BLOCK_N=tiles.block_n, BLOCK_K=block_k,
                             GROUP_M=tiles.group_m, USE_PDL=True)
            _, spilled, shared = compiled(fused_moe._moe_gemm_kernel, signature, constants, tiles.num_warps,
                                          tiles.num_stages)
            assert spilled == 0 and shared <= MAX_SHARED, (config, is_gated, spilled, shared)


def test_fp8_block_gemm_fits_every_bucket_config_at_qwen3_30b_shape() -> None:
    """Qwen3-30B-A3B-FP8's experts: FP8 weights with 128x128 block scales, K tiles within one block of columns."""
    num_experts, top_k, hidden, intermediate, _ = SHAPES["qwen3-30b-a3b"]
    signature = GEMM_SIGNATURE | {"b_ptr": "*fp8e4nv", "scales_ptr": "*fp32"}
    configs = {default_config(1 << b, num_experts, top_k) for b in range(14)}
    for config in configs:
        for is_gated, tiles, k in ((True, config.gate_up, hidden), (False, config.down, intermediate)):
            block_k = min(tiles.block_k, 128)
            constants = dict(PAIRS_PER_ROW=top_k if is_gated else 1, GATED=is_gated, ACTIVATION=0, ALPHA=1.702,
                             LIMIT=7.0, HAS_BIAS=False, MUL_WEIGHT=not is_gated, IEEE=False,
                             SCALE_ROWS=128, SCALE_COLUMNS=128, EVEN_K=k % block_k == 0, BLOCK_M=config.block_m,
                             BLOCK_N=tiles.block_n, BLOCK_K=block_k, GROUP_M=tiles.group_m, USE_PDL=True)
            _, spilled, shared = compiled(fused_moe._moe_gemm_kernel, signature, constants, tiles.num_warps,
                                          tiles.num_stages)
            assert spilled == 0 and shared <= MAX_SHARED, (config, is_gated, spilled, shared)


def test_float32_gemm_fits() -> None:
    signature = GEMM_SIGNATURE | {name: "*fp32" for name in ("a_ptr", "b_ptr", "bias_ptr", "c_ptr")}
    constants = dict(PAIRS_PER_ROW=2, GATED=True, ACTIVATION=0, ALPHA=0.0, LIMIT=0.0, HAS_BIAS=False,
                     MUL_WEIGHT=False, IEEE=True, EVEN_K=False, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128,
                     GROUP_M=1, USE_PDL=False)
    _, spilled, shared = compiled(fused_moe._moe_gemm_kernel, signature, constants, 4, 4)
    assert spilled == 0 and shared <= MAX_SHARED


def test_top_k_sum_kernel_fits() -> None:
    signature = {"rows_ptr": "*bf16", "add_ptr": "*bf16", "out_ptr": "*bf16", "hidden": "i32"}
    _, spilled, shared = compiled(moe_sum._sum_kernel, signature,
                                  dict(TOP_K=8, HAS_ADD=True, BLOCK=1024, USE_PDL=True), 4)
    assert spilled == 0 and shared <= MAX_SHARED


@pytest.mark.parametrize(("num_pairs", "num_experts"), [(8, 128), (4096, 128), (65536, 128), (65536, 256), (96, 32)])
def test_align_kernels_fit(num_pairs: int, num_experts: int) -> None:
    chunk = moe_align.chunk_size(num_pairs, num_experts)
    block_e = triton.next_power_of_2(num_experts)
    num_warps = 4 if chunk * block_e <= 4096 else 8
    common = {"ids_ptr": "*i32", "hist_ptr": "*i32", "sorted_ptr": "*i32"}
    place = common | {"block_experts_ptr": "*i32", "num_padded_ptr": "*i32", "num_pairs": "i32", "max_padded": "i32",
                      "num_chunks": "i32"}
    results = [compiled(moe_align._place_kernel, place, dict(NUM_EXPERTS=num_experts, BLOCK_M=16, CHUNK=chunk,
                                                             BLOCK_E=block_e, ROWS=16, FILL=1024,
                                                             IS_SINGLE=num_pairs <= chunk, USE_PDL=True), num_warps)]
    if num_pairs > chunk:
        results.append(compiled(moe_align._count_kernel, common | {"num_pairs": "i32", "max_padded": "i32"},
                                dict(NUM_EXPERTS=num_experts, CHUNK=chunk, BLOCK_E=block_e, FILL=1024, USE_PDL=True),
                                num_warps))
    assert all(spilled == 0 and shared <= MAX_SHARED for _, spilled, shared in results), results


@pytest.mark.parametrize(("group_size", "num_groups", "top_k_groups", "top_k", "scoring"),
                         [(128, 1, 1, 8, 0), (32, 8, 4, 8, 1), (32, 1, 1, 4, 2), (160, 1, 1, 8, 1)])
def test_route_kernel_fits(group_size: int, num_groups: int, top_k_groups: int, top_k: int, scoring: int) -> None:
    signature = {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32",
                 "logits_stride": "i32"}
    constants = dict(GROUP_SIZE=group_size, NUM_GROUPS=num_groups, TOP_K_GROUPS=top_k_groups, TOP_K=top_k,
                     SCORING=scoring, RENORMALIZE=True, EPSILON=0.0, HAS_BIAS=scoring == 1, SCALE=1.0,
                     BLOCK_G=triton.next_power_of_2(num_groups), BLOCK_E=triton.next_power_of_2(group_size),
                     BLOCK_K=triton.next_power_of_2(top_k), USE_PDL=True)
    num_warps = moe_route.num_warps_for(constants["BLOCK_G"] * constants["BLOCK_E"])
    _, spilled, shared = compiled(moe_route._route_kernel, signature, constants, num_warps)
    assert spilled == 0 and shared <= MAX_SHARED


DECODE_GATE_UP = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "ids_ptr": "*i32", "out_ptr": "*bf16",
                  "N": "i32", "stride_x": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_bias_e": "i32",
                  "logits_ptr": "*bf16", "route_bias_ptr": "*fp32", "route_weights_ptr": "*fp32",
                  "stride_logits": "i32"}
# Each shape's routing (for the gate/up kernel that routes itself), and the constants of one that does not.
SHAPE_ROUTINGS = {"qwen3-30b-a3b": Routing(128, 8), "gpt-oss-20b": Routing(32, 4, "top_k_softmax", has_bias=True),
                  "mixtral-8x7b": Routing(8, 2),
                  "glm-4.5-air": Routing(128, 8, "sigmoid", True, 1, 1, 1.0, has_correction_bias=True)}
UNROUTED = dict(FUSES_ROUTING=False, GROUP_SIZE=1, NUM_GROUPS=1, TOP_K_GROUPS=1, SCORING=0, RENORMALIZE=False,
                EPSILON=0.0, HAS_ROUTE_BIAS=False, SCALE=1.0, BLOCK_G=1, BLOCK_E=1, BLOCK_SLOTS=1)


def routed(routing: Routing) -> dict[str, object]:
    """The gate/up kernel's constants that route by `routing` (its correction bias present where it has one)."""
    rule = moe_route.rule_constants(routing, torch.zeros(1) if routing.has_correction_bias else None)
    renamed = {"HAS_BIAS": "HAS_ROUTE_BIAS", "BLOCK_K": "BLOCK_SLOTS"}
    return {renamed.get(k, k): v for k, v in rule.items() if k != "TOP_K"} | dict(FUSES_ROUTING=True)
DECODE_DOWN = {"h_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32",
               "add_ptr": "*bf16", "out_ptr": "*bf16", "N": "i32", "stride_we": "i32", "stride_wn": "i32",
               "stride_bias_e": "i32"}


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_kernels_fit_and_stream_weights_in_16_byte_loads(shape: str) -> None:
    """Every step the decode rule takes at the shape: no spills, and every tile a thread reads (gate, up and x's row
    broadcast; each slot's down and intermediate row) in 16-byte loads (ld.global.v4.b32)."""
    num_experts, top_k, hidden, intermediate, is_gpt_oss = SHAPES[shape]
    for num_tokens in [n for n in range(1, 9) if uses_decode_path(n, top_k, num_experts)]:
        gate_up = decode_tiles(num_tokens * top_k, intermediate, hidden)
        down = decode_tiles(num_tokens, hidden, intermediate)
        gate_up_constants = dict(K=hidden, TOP_K=top_k, ACTIVATION=int(is_gpt_oss), ALPHA=1.702, LIMIT=7.0,
                                 HAS_BIAS=is_gpt_oss, EVEN_K=hidden % gate_up.block_k == 0)
        kernels = [
            (moe_decode._gate_up_kernel, DECODE_GATE_UP, gate_up, gate_up_constants | UNROUTED),
            (moe_decode._gate_up_kernel, DECODE_GATE_UP, gate_up, gate_up_constants | routed(SHAPE_ROUTINGS[shape])),
            (moe_decode._down_kernel, DECODE_DOWN, down, dict(
                K=intermediate, TOP_K=top_k, HAS_BIAS=is_gpt_oss, HAS_ADD=True,
                EVEN_K=intermediate % down.block_k == 0, SLOT_GROUPS=down.slot_groups)),
        ]
        for (fn, signature, tiles, constants), num_tiles in zip(kernels, (3, 3, 2 * top_k), strict=True):
            constants |= dict(BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, NUM_STAGES=tiles.num_stages, USE_PDL=True)
            _, spilled, shared = compiled(fn, signature, constants, tiles.num_warps)
            assert spilled == 0 and shared <= MAX_SHARED, (shape, num_tokens, tiles, spilled)
            ptx = compile_for_hopper(fn, signature, constants, tiles.num_warps).asm["ptx"]
            loads_per_tile = tiles.block_n * tiles.block_k * 2 // (16 * 32 * tiles.num_warps)
            assert ptx.count("ld.global.v4.b32") >= num_tiles * loads_per_tile, (shape, num_tokens, tiles)


def test_decode_kernels_pipeline_their_k_loop_and_split_slots_when_asked() -> None:
    """Qwen3-30B-A3B at one token: a gate/up tile with stages brings its K tiles by cp.async into shared memory (the
    loop's num_stages; without stages no load goes through shared memory), and a down kernel over slot groups fits."""
    gate_up = dict(K=2048, TOP_K=8, ACTIVATION=0, ALPHA=1.702, LIMIT=7.0, HAS_BIAS=False, EVEN_K=True, BLOCK_N=8,
                   BLOCK_K=512, USE_PDL=True) | UNROUTED
    for num_stages in (1, 3):
        constants = gate_up | dict(NUM_STAGES=num_stages)
        kernel = compile_for_hopper(moe_decode._gate_up_kernel, DECODE_GATE_UP, constants, 4)
        assert ("cp.async" in kernel.asm["ptx"]) == (num_stages > 1)
        _, spilled, shared = compiled(moe_decode._gate_up_kernel, DECODE_GATE_UP, constants, 4)
        assert spilled == 0 and shared <= MAX_SHARED
    down = dict(K=768, TOP_K=8, HAS_BIAS=False, HAS_ADD=False, EVEN_K=True, BLOCK_N=16, BLOCK_K=256, SLOT_GROUPS=8,
                NUM_STAGES=2, USE_PDL=True)
    signature = DECODE_DOWN | {"out_ptr": "*fp32", "add_ptr": "*fp32"}  # the groups' float32 sums
    _, spilled, shared = compiled(moe_decode._down_kernel, signature, down, 4)
    assert spilled == 0 and shared <= MAX_SHARED
