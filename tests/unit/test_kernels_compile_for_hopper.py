"""The attention kernels with every variant switch on, the elementwise kernels in Gemma's forms, the quantized
GEMMs in every tile config of their rule, the MoE router at 128 and 256 experts, the skinny GEMM at one row and the
verifying step's lookup, layout and acceptance at every draft length, compiled ahead of time for Hopper (sm_90) with
Triton's own compiler and ptxas, on a machine without a GPU: what Triton's interpreter accepts and its compiler refuses
(a global read that is not a constexpr, a construct the code generator lacks) fails here rather than on the first GPU
run. tests/gpu/ runs them."""

import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gpu.kernels import (  # noqa: E402
    decode_attention,
    fp8_gemm,
    fp8_quant,
    fp8_row_gemv,
    int4_row_gemv,
    int4_wide_gemv,
    int_gemm,
    moe_route,
    ngram_drafts,
    prefill_attention,
    qk_norm_rope,
    quant_gemm_configs,
    quant_gemv,
    rms_norm,
    silu_and_mul,
    skinny_gemm,
    store_kv,
    verify_layout,
)
from gpu.kernels.quant_gemm_configs import (  # noqa: E402
    GemvTiles,
    QuantTiles,
    WideGemvTiles,
    gemv_tiles,
    small_int4_tiles,
    tensor_core_tiles,
    wide_gemv_tiles,
)
from gpu.kernels.skinny_gemm_configs import PROLOGUE_BUCKETS, TABLES, SkinnyConfig, prologue_config  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
FLOATS = {"scale_log2", "softcap_in", "softcap_out", "eps", "k_scale", "v_scale"}


def compile_for_hopper(kernel: object, pointers: dict[str, str], constexprs: dict[str, object]) -> None:
    assert compiled_ptx(kernel, pointers, constexprs, fp_fusion=True)


ATTENTION = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", block_tables_ptr="*i32",
                 context_lens_ptr="*i32", row_order_ptr="*i32", sinks_ptr="*fp32", out_ptr="*bf16",
                 partial_out_ptr="*fp32", partial_lse_ptr="*fp32", query_start_loc_ptr="*i32")
VARIANT_FLAGS = dict(HAS_WINDOW=True, HAS_SINKS=True, HAS_SOFTCAP=True)


@pytest.mark.parametrize("queries", [1, 5])  # one query a row (decode), a verifying step's k + 1 a program
@pytest.mark.parametrize("num_splits", [1, 8])
def test_decode_kernels_with_every_variant_switch(num_splits: int, queries: int) -> None:
    compile_for_hopper(decode_attention._decode_split_kernel, ATTENTION, dict(
        GROUP=8, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_H=16 if queries == 1 else 64, BLOCK_D=64, BLOCK_N=64,
        NUM_SPLITS=num_splits, DOT_PRECISION="tf32", HAS_ROW_ORDER=queries == 1, USE_PDL=False, QUERIES=queries,
        K_TRANSPOSED=False, FP8_AS_F16=False, **VARIANT_FLAGS))
    compile_for_hopper(decode_attention._decode_reduce_kernel, ATTENTION, dict(
        HEAD_DIM=64, BLOCK_D=64, NUM_SPLITS=8, HAS_SINKS=True, USE_PDL=False))


HISTORY = dict(tokens_ptr="*i32", lengths_ptr="*i32", slots_ptr="*i64", num_blocks_ptr="*i64", drafts_ptr="*i64",
               num_drafts_ptr="*i64")
LAYOUT = HISTORY | dict(tables_ptr="*i32", token_ids_ptr="*i64", positions_ptr="*i64", slot_mapping_ptr="*i64",
                        context_lens_ptr="*i32", query_start_ptr="*i32", query_rows_ptr="*i64",
                        query_lens_ptr="*i32", query_tables_ptr="*i32")


@pytest.mark.parametrize("num_drafts", range(6))
def test_the_verifying_steps_lookup_layout_and_acceptance(num_drafts: int) -> None:
    search = dict(MIN_N=1, MAX_N=4, BLOCK_=ngram_drafts.BLOCK, END_BITS_=ngram_drafts.END_BITS)
    block_q = triton.next_power_of_2(num_drafts + 1)
    if num_drafts:
        compile_for_hopper(ngram_drafts._ngram_drafts_kernel, dict(history_ptr="*i32", lengths_ptr="*i32",
                           drafts_ptr="*i32", num_drafts_ptr="*i32"),
                           dict(K=num_drafts, BLOCK_K=triton.next_power_of_2(num_drafts), **search))
    for as_rows in (True, False):
        compile_for_hopper(verify_layout._lay_out_kernel, LAYOUT, dict(
            K=num_drafts, AS_ROWS=as_rows, BLOCK_Q=block_q, BLOCK_B=verify_layout.TABLE_CHUNK, **search))
    compile_for_hopper(verify_layout._accept_kernel, HISTORY | dict(sampled_ptr="*i64", counts_ptr="*i64"),
                       dict(K=num_drafts, BLOCK_Q=block_q))


def test_prefill_kernel_with_every_variant_switch() -> None:
    compile_for_hopper(prefill_attention._prefill_kernel, ATTENTION, dict(
        GROUP=4, HEAD_DIM=256, BLOCK_SIZE=16, BLOCK_M=64, BLOCK_Q=16, BLOCK_D=256, BLOCK_N=64, DOT_PRECISION="tf32",
        **VARIANT_FLAGS))


FP8_CACHE = dict(ATTENTION, k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv")


def compile_qk_norm_rope(cache: str, constexprs: dict[str, object]) -> None:
    """The q/k norm + RoPE kernel writing K/V to caches of type `cache`, with a norm; a whole rotation and no gates
    unless `constexprs` say otherwise."""
    whole = dict(ROTARY_DIM=constexprs["HEAD_DIM"], Q_HEAD_STRIDE=constexprs["HEAD_DIM"])
    compile_for_hopper(qk_norm_rope._qk_norm_rope_kernel, dict(
        qkv_ptr="*bf16", positions_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", q_weight_ptr="*bf16",
        k_weight_ptr="*bf16", q_out_ptr="*bf16", k_out_ptr="*bf16", k_cache_ptr=cache, v_cache_ptr=cache,
        slot_mapping_ptr="*i64"), dict(HAS_NORM=True, STORE_KV=True, USE_PDL=False, **whole | constexprs))


def test_attention_kernels_read_and_write_an_fp8_cache() -> None:
    compile_for_hopper(decode_attention._decode_split_kernel, FP8_CACHE, dict(
        GROUP=8, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_H=16, BLOCK_D=128, BLOCK_N=64, NUM_SPLITS=4,
        DOT_PRECISION="tf32", HAS_ROW_ORDER=True, USE_PDL=True, HAS_WINDOW=False, HAS_SINKS=False, HAS_SOFTCAP=False,
        QUERIES=1, K_TRANSPOSED=True, FP8_AS_F16=True))
    compile_for_hopper(prefill_attention._prefill_kernel, FP8_CACHE, dict(
        GROUP=4, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_M=64, BLOCK_Q=16, BLOCK_D=128, BLOCK_N=64, DOT_PRECISION="tf32",
        HAS_WINDOW=False, HAS_SINKS=False, HAS_SOFTCAP=False))
    compile_qk_norm_rope("*fp8e4nv", dict(NUM_HEADS=32, NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, WEIGHT_OFFSET=0.0,
                                          SCALES_IN_FLOAT32=False))
    compile_for_hopper(store_kv._store_kv_kernel, dict(
        key_ptr="*fp32", value_ptr="*fp32", k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv", slot_mapping_ptr="*i64"),
        dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128))


def test_elementwise_kernels_in_gemmas_forms() -> None:
    compile_for_hopper(rms_norm._rms_norm_kernel, dict(
        x_ptr="*bf16", residual_ptr="*bf16", weight_ptr="*bf16", out_ptr="*bf16", sum_ptr="*bf16"), dict(
        HIDDEN=640, BLOCK=1024, HAS_RESIDUAL=True, WEIGHT_OFFSET=1.0, SCALES_IN_FLOAT32=True, USE_PDL=False))
    compile_qk_norm_rope("*bf16", dict(NUM_HEADS=4, NUM_KV_HEADS=1, HEAD_DIM=256, BLOCK_H=4, WEIGHT_OFFSET=1.0,
                                       SCALES_IN_FLOAT32=True))
    # Qwen3-Next's and Qwen3.5's gated layers: a quarter of each head rotated, the queries between their gates.
    compile_qk_norm_rope("*bf16", dict(NUM_HEADS=16, NUM_KV_HEADS=2, HEAD_DIM=256, ROTARY_DIM=64, Q_HEAD_STRIDE=512,
                                       BLOCK_H=4, WEIGHT_OFFSET=1.0, SCALES_IN_FLOAT32=True))
    compile_for_hopper(silu_and_mul._silu_and_mul_kernel, dict(x_ptr="*bf16", out_ptr="*bf16"), dict(
        INTERMEDIATE=2048, BLOCK=1024, IS_GELU_TANH=True, USE_PDL=False))


# The quantized GEMMs at Qwen3-8B's decode shapes: every tile config their rule gives from 1 to 1024 rows fits an
# H100's shared memory, spills no registers and pipelines its loads (shared memory for two stages or more).
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
MAX_SHARED = 227 * 1024
MULTIPLES_OF_16 = frozenset({"K", "num_words", "k_per_split", "stride_xm", "stride_wn", "stride_wsn", "stride_qn",
                             "stride_gn", "stride_om", "stride_os", "stride_rm"})
QUANT_ROWS = (1, 16, 32, 64, 128, 1024)


def compiled_as_launched(kernel: object, signature: dict[str, str], constexprs: dict[str, object], num_warps: int,
                         num_stages: int, divisible: frozenset[str] = MULTIPLES_OF_16, **options: object) -> object:
    """`kernel` compiled for sm_90, its arguments specialized as a launch on a GPU specializes them (pointers 16-byte
    aligned, the sizes and strides in `divisible`, multiples of 16 at a launch, marked so); `signature` in the
    kernel's argument order."""
    names = list(signature)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if signature[name].startswith("*") or name in divisible}
    source = ASTSource(fn=kernel, signature=signature | dict.fromkeys(constexprs, "constexpr"), constexprs=constexprs,
                       attrs=attrs)
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages, **options})


def spilled_bytes(compiled: object) -> int:
    """The bytes a compiled kernel spills to its stack, as cuobjdump reads its cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])  # type: ignore[attr-defined]
        cubin.flush()
        usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))  # type: ignore[union-attr]


def compiled_usage(kernel: object, signature: dict[str, str], constexprs: dict[str, object], num_warps: int,
                   num_stages: int) -> tuple[int, int]:
    """(spilled bytes, shared bytes) of `kernel` compiled as a launch specializes it."""
    compiled = compiled_as_launched(kernel, signature, constexprs, num_warps, num_stages)
    return spilled_bytes(compiled), compiled.metadata.shared  # type: ignore[attr-defined]


def _tile_configs(kind: str) -> set[QuantTiles]:
    return {tensor_core_tiles(rows, n, k, kind) for rows in QUANT_ROWS for n, k in ((6144, 4096), (4096, 12288))}


FP8_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "in_scale_ptr": "*fp32", "bias_ptr": "*bf16",
                 "out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32", "stride_xm": "i32",
                 "stride_wn": "i32", "stride_wsn": "i32", "stride_os": "i32", "stride_om": "i32"}


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize("scales", ["blocks", "per-row", "static"])
def test_fp8_gemm_tiles_fit_and_pipeline(scales: str) -> None:
    for t in _tile_configs("fp8"):
        constexprs = dict(SCALE_ROWS=128 if scales == "blocks" else 1, BLOCK_SCALES=scales == "blocks",
                          STATIC=scales == "static", GROUP=128, HAS_BIAS=False, IS_PARTIAL=t.split_k > 1, EVEN_K=True,
                          USE_PDL=True, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k)
        spilled, shared = compiled_usage(fp8_gemm._fp8_gemm_kernel, FP8_SIGNATURE, constexprs, t.num_warps,
                                         t.num_stages)
        stage = t.block_n * 128 + t.block_m * 128 * 2  # one group's weight tile (FP8) and x tile (bf16)
        assert spilled == 0 and 2 * stage <= shared <= MAX_SHARED, (t, spilled, shared)


INT_SIGNATURE = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "o_ptr": "*bf16",
                 "perm_ptr": "*i32", "bias_ptr": "*bf16", "out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 "k_per_split": "i32", "num_groups": "i32", "stride_xm": "i32", "stride_qn": "i32", "stride_gn": "i32",
                 "stride_os": "i32", "stride_om": "i32"}


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize(("bits", "group", "kind"), [(4, 128, "symmetric"), (4, 128, "zeros"), (4, 32, "offsets"),
                                                     (4, 32, "act-order"), (8, 16, "offsets"), (8, 128, "symmetric")])
def test_int_gemm_tiles_fit_and_pipeline(bits: int, group: int, kind: str) -> None:
    for t in _tile_configs(f"int{bits}"):
        constexprs = dict(BITS=bits, GROUP=group, ZERO=8.0, HAS_ZEROS=kind == "zeros", HAS_OFFSETS=kind == "offsets",
                          HAS_PERM=kind == "act-order", PACKED=bits == 4, DOT_PRECISION="tf32", HAS_BIAS=False,
                          SUMS=bits == 4 and group >= 128 and kind != "act-order" and t.block_m <= 32,
                          IS_PARTIAL=t.split_k > 1, EVEN_K=True, USE_PDL=True, BLOCK_M=t.block_m,
                          BLOCK_N=t.block_n, BLOCK_K=t.block_k)
        spilled, shared = compiled_usage(int_gemm._int_gemm_kernel, INT_SIGNATURE, constexprs, t.num_warps,
                                         t.num_stages)
        stage = t.block_n * t.block_k * bits // 8  # one weight tile
        assert spilled == 0 and 2 * stage <= shared <= MAX_SHARED, (t, spilled, shared)


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
def test_fp8_activation_quantization_compiles() -> None:
    signature = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "in_scale_ptr": "*fp32", "M": "i32",
                 "K": "i32", "stride_xm": "i32", "stride_qm": "i32", "stride_sm": "i32", "stride_sg": "i32"}
    for group, per_token in ((128, False), (1024, True)):
        spilled, _ = compiled_usage(fp8_quant._quantize_rows_kernel, signature, dict(
            GROUP=group, PER_TOKEN=per_token, STATIC=False, USE_PDL=True, BLOCK=1024), 4, 2)
        assert spilled == 0

    norm_signature = {"x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "sum_ptr": "*bf16",
                      "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "in_scale_ptr": "*fp32", "M": "i32", "x_stride": "i32",
                      "residual_stride": "i32", "eps": "fp32", "stride_qm": "i32", "stride_sm": "i32",
                      "stride_sg": "i32"}
    gated_signature = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "in_scale_ptr": "*fp32", "M": "i32",
                       "x_stride": "i32", "stride_qm": "i32", "stride_sm": "i32", "stride_sg": "i32"}
    for group, per_token in ((128, False), (4096, True)):  # Qwen3-8B's hidden and intermediate sizes
        spilled, _ = compiled_usage(fp8_quant._rms_norm_quantize_kernel, norm_signature, dict(
            HIDDEN=4096, BLOCK=4096, HAS_RESIDUAL=True, WEIGHT_OFFSET=0.0, SCALES_IN_FLOAT32=False, GROUP=group,
            PER_TOKEN=per_token, STATIC=False, USE_PDL=True), 16, 2)
        assert spilled == 0
        spilled, _ = compiled_usage(fp8_quant._gated_quantize_kernel, gated_signature, dict(
            INTERMEDIATE=12288, BLOCK=1024, IS_GELU_TANH=False, GROUP=min(group, 1024), PER_TOKEN=per_token,
            STATIC=False, USE_PDL=True), 4, 2)
        assert spilled == 0


ROUTE_SIGNATURE = {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32",
                   "logits_stride": "i32"}


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize(("num_experts", "num_groups", "top_k_groups", "scoring", "has_bias"), [
    (128, 1, 1, "softmax", False), (128, 1, 1, "sigmoid", True), (128, 1, 1, "top_k_softmax", False),
    (256, 1, 1, "softmax", False), (256, 8, 4, "sigmoid", True)])
def test_route_kernel_reduces_in_one_warp(num_experts: int, num_groups: int, top_k_groups: int, scoring: str,
                                          has_bias: bool) -> None:
    """At 128 and 256 experts the router runs in the warps its rule gives (one) with no shared memory (every top-k
    round's max in warp shuffles) and no spills."""
    group_size = num_experts // num_groups
    constexprs = dict(GROUP_SIZE=group_size, NUM_GROUPS=num_groups, TOP_K_GROUPS=top_k_groups, TOP_K=8,
                      SCORING=moe_route.SCORINGS[scoring], RENORMALIZE=True, EPSILON=0.0, HAS_BIAS=has_bias, SCALE=1.0,
                      BLOCK_G=num_groups, BLOCK_E=group_size, BLOCK_K=8, USE_PDL=True)
    num_warps = moe_route.num_warps_for(num_experts)
    spilled, shared = compiled_usage(moe_route._route_kernel, ROUTE_SIGNATURE, constexprs, num_warps, 1)
    assert (num_warps, spilled, shared) == (1, 0, 0)


GEMV_SIGNATURE = {"x_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                  "stride_xm": "i32", "stride_om": "i32"}
FP8_GEMV_SIGNATURE = GEMV_SIGNATURE | {"w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "num_scale_cols": "i32",
                                       "stride_wn": "i32", "stride_wsn": "i32"}
INT_GEMV_SIGNATURE = GEMV_SIGNATURE | {"q_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "o_ptr": "*bf16",
                                       "perm_ptr": "*i32", "num_words": "i32", "num_groups": "i32", "stride_qn": "i32",
                                       "stride_gn": "i32"}


def _gemv_usage(kernel: object, signature: dict[str, str], constexprs: dict[str, object], t: GemvTiles) -> int:
    names = kernel.arg_names  # type: ignore[attr-defined]
    ordered = {name: signature[name] for name in names if name in signature}
    ahead = {"AHEAD": t.ahead} if "AHEAD" in names else {}
    spilled, _ = compiled_usage(kernel, ordered, constexprs | ahead | dict(
        USE_PDL=True, HAS_BIAS=True, EVEN_K=True, ROWS=t.rows, BLOCK_N=t.block_n, BLOCK_K=t.block_k), t.num_warps, 1)
    return spilled


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_gemv_tiles_of_the_rule_compile_without_spills(rows: int) -> None:
    """The GEMV rule's tiles at each row bucket (up to the tables' widest) for FP8 blocks and per-row scales, int4
    with zero points and act order (from two rows: one row is the row GEMV's), and int8 with offsets; small int4
    products' tiles from two rows (groups of 32 with offsets)."""
    t = gemv_tiles(rows, 4096, "fp8")
    for group, block_scales in ((128, True), (t.block_k, False)):
        assert _gemv_usage(quant_gemv._fp8_gemv_kernel, FP8_GEMV_SIGNATURE, dict(
            SCALE_ROWS=128 if block_scales else 1, GROUP=group, BLOCK_SCALES=block_scales), t) == 0, (t, group)
    for bits, kind in ((4, "zeros"), (4, "act-order"), (8, "offsets")):
        if bits == 4 and rows == 1:
            continue  # the row GEMV's tiles: test_row_gemv_loads_16_bytes_a_thread_and_syncs_nothing_in_its_loop
        t = gemv_tiles(rows, 4096, f"int{bits}")
        assert _gemv_usage(quant_gemv._int_gemv_kernel, INT_GEMV_SIGNATURE, dict(
            BITS=bits, GROUP=128, ZERO=8.0, HAS_ZEROS=kind == "zeros", HAS_OFFSETS=kind == "offsets",
            HAS_PERM=kind == "act-order"), t) == 0, (t, kind)
    if rows > 1:  # small int4 products' tiles, at the default model's K and its GGUF's groups of 32 with offsets
        for t in (small_int4_tiles(rows, 576), replace(small_int4_tiles(rows, 576), ahead=True)):
            assert _gemv_usage(quant_gemv._int_gemv_kernel, INT_GEMV_SIGNATURE, dict(
                BITS=4, GROUP=32, ZERO=0.0, HAS_ZEROS=False, HAS_OFFSETS=True, HAS_PERM=False), t) == 0, t


def test_gated_delta_kernels() -> None:
    from gpu.kernels import gated_delta_decode, gated_delta_rows

    pointers = dict(qkv_ptr="*bf16", g_ptr="*fp32", beta_ptr="*bf16", state_ptr="*fp32", slots_ptr="*i64",
                    keeps_ptr="*fp32", out_ptr="*fp32", row_starts_ptr="*i64", row_pieces_ptr="*i64",
                    piece_ends_ptr="*i64", piece_states_ptr="*i64")
    compile_for_hopper(gated_delta_rows._gated_delta_rows_kernel, pointers, dict(
        NUM_VALUE_HEADS=32, VALUE_HEADS_PER_KEY_HEAD=2, KEY_DIM=128, VALUE_DIM=128, K_OFFSET=2048, V_OFFSET=4096,
        BLOCK_K=128, BLOCK_V=8, SCALE=128**-0.5))
    decode_pointers = {name: pointers[name] for name in gated_delta_decode._gated_delta_decode_kernel.arg_names
                       if name in pointers}
    compile_for_hopper(gated_delta_decode._gated_delta_decode_kernel, decode_pointers, dict(
        NUM_VALUE_HEADS=32, VALUE_HEADS_PER_KEY_HEAD=2, KEY_DIM=128, VALUE_DIM=128, K_OFFSET=2048, V_OFFSET=4096,
        BLOCK_K=128, BLOCK_V=32, SCALE=128**-0.5))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_hybrid_glue_kernels(dtype: str) -> None:
    """The Gated DeltaNet's norm and gates kernels at Qwen3.5's shape (a rank's 32 value heads of 128) and the output
    gates' kernel: torch's libdevice math and IEEE division compiled in."""
    from gpu.kernels import gated_delta_gates, gated_rms_norm

    norm = gated_rms_norm._gated_rms_norm_kernel
    norm_pointers = dict(x_ptr="*fp32", gate_ptr=f"*{dtype}", weight_ptr=f"*{dtype}", out_ptr=f"*{dtype}")
    norm_ptx = compiled_ptx(norm, norm_pointers, dict(NUM_HEADS=32, HEAD_DIM=128, BLOCK_H=16, BLOCK_D=128,
                                                      USE_PDL=True))
    gates = gated_delta_gates._gated_delta_gates_kernel
    gates_ptx = compiled_ptx(gates, dict(a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", a_log_ptr=f"*{dtype}",
                                         dt_bias_ptr=f"*{dtype}", g_ptr="*fp32", beta_ptr=f"*{dtype}"),
                             dict(NUM_HEADS=32, THRESHOLD=20.0, BLOCK_T=16, BLOCK_H=32, USE_PDL=True))
    for ptx in (norm_ptx, gates_ptx):
        assert "div.rn.f32" in ptx and "div.full.f32" not in ptx  # torch's IEEE division, not the approximate one
    assert "rsqrt.approx" in norm_ptx  # libdevice's rsqrtf, torch's CUDA rsqrt
    from gpu.kernels import sigmoid_gate

    for per_element in (True, False):
        ptx = compiled_ptx(sigmoid_gate._sigmoid_gate_kernel, dict(x_ptr=f"*{dtype}", gate_ptr=f"*{dtype}",
                                                                   out_ptr=f"*{dtype}"),
                           dict(NUM_GROUPS=16, SIZE=256, GATE_PER_ELEMENT=per_element, BLOCK=256, USE_PDL=True))
        assert "div.rn.f32" in ptx and "div.full.f32" not in ptx


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_causal_conv_rows_kernel(dtype: str) -> None:
    """The prompt rows' convolution at Qwen3.5's kernel size and channels: torch's IEEE division in its SiLU."""
    from gpu.kernels import causal_conv_rows

    pointers = dict(x_ptr=f"*{dtype}", weight_ptr=f"*{dtype}", state_ptr=f"*{dtype}", out_ptr=f"*{dtype}",
                    slots_ptr="*i64", keeps_ptr="*fp32", row_starts_ptr="*i64", row_pieces_ptr="*i64",
                    piece_ends_ptr="*i64", piece_states_ptr="*i64")
    ptx = compiled_ptx(causal_conv_rows._causal_conv_rows_kernel, pointers, dict(
        CHANNELS=8192, KERNEL_SIZE=4, BLOCK_C=causal_conv_rows.BLOCK_CHANNELS, BLOCK_T=causal_conv_rows.BLOCK_TOKENS,
        BLOCK_W=4, USE_PDL=True))
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx


NGRAM_SIGNATURE = {"history_ptr": "*i32", "lengths_ptr": "*i32", "drafts_ptr": "*i32", "num_drafts_ptr": "*i32",
                   "history_stride": "i32", "num_columns": "i32"}


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize(("max_n", "max_drafts"), [(1, 1), (4, 4), (8, 16)])
def test_ngram_drafts_scan_stays_in_registers(max_n: int, max_drafts: int) -> None:
    """The device n-gram drafts at the wrapper's tile: a row's scan, however long the row, spills nothing (shared
    memory only for the tile's reduction)."""
    from gpu.kernels import ngram_drafts

    constexprs = dict(MIN_N=1, MAX_N=max_n, K=max_drafts, BLOCK_K=max_drafts, BLOCK_=ngram_drafts.BLOCK,
                      END_BITS_=ngram_drafts.END_BITS)
    spilled, shared = compiled_usage(ngram_drafts._ngram_drafts_kernel, NGRAM_SIGNATURE, constexprs,
                                     ngram_drafts.NUM_WARPS, 1)
    assert spilled == 0 and shared <= 1024, (spilled, shared)


def compiled_ptx(kernel: object, pointers: dict[str, str], constexprs: dict[str, object], fp_fusion: bool = False
                 ) -> str:
    """`kernel` compiled for sm_90 (by default as the wrappers that round as torch does launch it: no fp fusion): its
    PTX. Arguments not named are i32, or fp32 where FLOATS names them."""
    names = kernel.arg_names  # type: ignore[attr-defined]
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name in FLOATS else "i32")
                 for name in names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constexprs.items()})
    return triton.compile(source, target=HOPPER, options={"enable_fp_fusion": fp_fusion}).asm["ptx"]


def loop_body(ptx: str) -> str:
    """The PTX between a loop's label and its backward branch (the first such loop)."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\$L__\w+):", line))}
    for i, line in enumerate(lines):
        target = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if target and labels.get(target.group(1), i) < i:
            return "\n".join(lines[labels[target.group(1)]:i + 1])
    raise AssertionError("no loop in the PTX")


ROW_GEMV_SIGNATURE = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "o_ptr": "*bf16",
                      "bias_ptr": "*bf16", "out_ptr": "*bf16", "N": "i32", "K": "i32", "num_words": "i32",
                      "num_groups": "i32", "stride_qn": "i32", "stride_gn": "i32", "stride_xm": "i32",
                      "stride_ym": "i32"}


def row_gemv_constexprs(group: int, kind: str, zero: float = 8.0) -> dict[str, object]:
    """The row GEMV's switches for a format: groups of `group` columns, zero points per group ("zeros"), offsets
    ("offsets") or the constant `zero`, as int4_row_gemv passes them."""
    return dict(GROUP=group, **int4_row_gemv.zero_point_constexprs(zero), HAS_ZEROS=kind == "zeros",
                HAS_OFFSETS=kind == "offsets")


def row_gemv_compiled(constexprs: dict[str, object], t: GemvTiles) -> tuple[str, str, int]:
    """(PTX, SASS, spilled bytes) of the row GEMV compiled as a launch at Qwen3-8B's shapes specializes it."""
    kernel = int4_row_gemv._int4_row_gemv_kernel
    constexprs = constexprs | dict(HAS_BIAS=False, EVEN_K=True, USE_PDL=True, BLOCK_N=t.block_n, BLOCK_K=t.block_k)
    signature = {name: ROW_GEMV_SIGNATURE[name] for name in kernel.arg_names if name not in constexprs}
    compiled = compiled_as_launched(kernel, signature, constexprs, row_gemv_warps(t), 1,
                                    frozenset({"K", "num_words", "stride_qn", "stride_xm"}), enable_fp_fusion=True)
    return compiled.asm["ptx"], cubin_sass(compiled), spilled_bytes(compiled)  # type: ignore[attr-defined]


def row_gemv_warps(t: GemvTiles) -> int:
    return max(1, min(t.num_warps, t.block_k // 1024))  # as the wrapper launches it


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize(("group", "kind"), [(128, "symmetric"), (128, "zeros"), (32, "offsets"), (16, "zeros")])
@pytest.mark.parametrize("k", [4096, 12288])
def test_row_gemv_loads_16_bytes_a_thread_and_syncs_nothing_in_its_loop(group: int, kind: str, k: int) -> None:
    """The W4A16 row GEMV at the rule's tiles: its loop reads the weights and x in 128-bit loads (the scales,
    zero points and offsets 16 bits each), touches no shared memory, waits at no barrier, spills nothing, and
    takes each pair of weights in two packed float16 multiply-adds (the level less its zero point, its product
    with x)."""
    t = gemv_tiles(1, k, "int4")
    ptx, _, spilled = row_gemv_compiled(row_gemv_constexprs(group, kind), t)
    loop = loop_body(ptx)
    loads = re.findall(r"ld\.global(?:\.nc)?(?:\.L1::\w+|\.L2::\w+)*\.(\w+\.\w+|\w+)", loop)
    wide, narrow = loads.count("v4.b32"), [load for load in loads if load != "v4.b32"]
    rows_per_thread = t.block_n  # every warp on its own 32 x 32 columns
    assert wide == rows_per_thread + 4, loads  # each row's 4 words, and x's 32 columns in 4
    assert set(narrow) <= {"b16"}, loads
    assert "bar.sync" not in loop and "shared" not in loop and spilled == 0
    assert loop.count("fma.rn.f16x2") >= 2 * 16 * rows_per_thread  # 16 pairs of columns a row
    assert loop.count("mul.rn.bf16x2") == 16  # x's 32 columns scaled into float16's range, once for all rows


def compiled_sass(kernel: object, pointers: dict[str, str], constexprs: dict[str, object], num_warps: int,
                  num_stages: int) -> str:
    """`kernel` compiled for sm_90 as a launch specializes it (fp fusion on): its SASS. Arguments not named are
    i32, or fp32 where FLOATS names them."""
    signature = {name: pointers.get(name, "fp32" if name in FLOATS else "i32")
                 for name in kernel.arg_names if name not in constexprs}  # type: ignore[attr-defined]
    return cubin_sass(compiled_as_launched(kernel, signature, constexprs, num_warps, num_stages,
                                           enable_fp_fusion=True))


def cubin_sass(compiled: object) -> str:
    """A compiled kernel's SASS, as cuobjdump reads its cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])  # type: ignore[attr-defined]
        cubin.flush()
        return subprocess.run([str(CUOBJDUMP), "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout


def loop_bodies(sass: str) -> list[list[str]]:
    """The instructions of each loop of `sass`: from a backward branch's target to the branch (a branch to itself,
    the trap after the exit, is no loop)."""
    code = [(int(address, 16), text.strip()) for address, text in re.findall(r"/\*([0-9a-f]{4,})\*/([^;]*);", sass)]
    loops = []
    for address, text in code:
        branch = re.search(r"\bBRA(?:\.\w+)* (0x[0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            loops.append([line for at, line in code if int(branch.group(1), 16) <= at <= address])
    return loops


SKINNY_POINTERS = dict(x_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16", out_ptr="*bf16", res_ptr="*bf16",
                       norm_w_ptr="*bf16", sum_ptr="*bf16")
SHARED_OR_SPILL = re.compile(r"\b(BAR|LDS|STS|LDSM|STSM|LDL|STL)\b")


Launch = tuple[int, bool, SkinnyConfig, bool]  # PROLOGUE, HAS_RESIDUAL, config, EVEN_K
PROLOGUE_VARIANTS = {"norm": ((skinny_gemm.RMS_NORM.value, True), (skinny_gemm.RMS_NORM.value, False)),
                     "silu": ((skinny_gemm.SILU_AND_MUL.value, False),)}


def _one_row_launches() -> list[Launch]:
    """Every one-row launch on the fma path: the H100 and H200 tables' one-row fma entries, and on the GPUs that run
    prologues the prologue rule's config at every K of the tables' one-row shapes."""
    launches: set[Launch] = set()
    for gpu, table in TABLES.items():
        for (bucket, _, k), config in table.items():
            if bucket != 1:
                continue
            if config is not None and not config.use_dot:
                launches.add((skinny_gemm.NO_PROLOGUE.value, False, config, k % (config.block_k * config.split_k) == 0))
            for kind, variants in PROLOGUE_VARIANTS.items():
                prologue = prologue_config(1, k, kind, PROLOGUE_BUCKETS.get(gpu, {}))
                if prologue is not None:
                    even_k = k % (prologue.block_k * prologue.split_k) == 0
                    launches.update((number, has_residual, prologue, even_k) for number, has_residual in variants)
    return sorted(launches, key=str)


def _launch_id(launch: Launch) -> str:
    prologue, has_residual, c, even_k = launch
    return (f"prologue{prologue}{'-residual' * has_residual}-{c.block_n}x{c.block_k}-split{c.split_k}-"
            f"warps{c.num_warps}{'-even' * even_k}")


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize("launch", _one_row_launches(), ids=_launch_id)
def test_skinny_gemm_one_row_loops_stay_in_registers(launch: Launch) -> None:
    """Batch-1 decode's products (and the prologues' norm and SiLU) stream W with 16-byte loads and multiply in
    registers: no barrier, shared memory or spill inside any loop of the kernel."""
    prologue, has_residual, config, even_k = launch
    constexprs = dict(PROLOGUE=prologue, HAS_RESIDUAL=has_residual, HAS_BIAS=False, IS_PARTIAL=config.split_k > 1,
                      EVEN_K=even_k, USE_DOT=False, USE_PDL=True, BLOCK_M=1, BLOCK_N=config.block_n,
                      BLOCK_K=config.block_k)
    sass = compiled_sass(skinny_gemm._skinny_gemm_kernel, SKINNY_POINTERS, constexprs, config.num_warps,
                         config.num_stages)
    loops = loop_bodies(sass)
    assert len(loops) == 1 + (prologue == skinny_gemm.RMS_NORM.value), [len(body) for body in loops]  # norm: squares
    for body in loops:
        assert not [line for line in body if SHARED_OR_SPILL.search(line)], body
    assert any("LDG.E.128" in line for line in loops[-1])


# The tiles the H100 sweep measured fastest for the row GEMV at Qwen3-8B's one-row products
ROW_GEMV_SWEPT_TILES = [GemvTiles(1, 4, 1024, 4), GemvTiles(1, 4, 2048, 4), GemvTiles(1, 4, 2048, 8),
                        GemvTiles(1, 4, 4096, 4)]
# SASS, per thread, in the loop at those tiles, x's scaling into float16's range included
MAX_INSTRUCTIONS_PER_WEIGHT = {"symmetric": 2.8, "zeros": 3.1}


def row_gemv_loop(kind: str, t: GemvTiles) -> tuple[list[str], int]:
    """(the SASS of the row GEMV's loop less its NOPs, spilled bytes) at groups of 128 and x in bf16."""
    _, sass, spilled = row_gemv_compiled(row_gemv_constexprs(128, kind), t)
    (loop,) = loop_bodies(sass)
    return [line for line in loop if line != "NOP"], spilled


def row_gemv_weights_per_thread(t: GemvTiles) -> int:
    """Weights a thread multiplies in one pass of the row GEMV's loop: its rows' 32-column chunks."""
    return t.block_n * t.block_k // (32 * row_gemv_warps(t))


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize("t", ROW_GEMV_SWEPT_TILES, ids=repr)
@pytest.mark.parametrize("kind", ["symmetric", "zeros"])
def test_row_gemv_issues_few_instructions_per_weight(t: GemvTiles, kind: str) -> None:
    """At the tiles the sweep chose for it (groups of 128, x in bf16), the loop's SASS issues at most
    MAX_INSTRUCTIONS_PER_WEIGHT instructions per weight a thread multiplies: decode at one row reads its weights
    once, so the loop must keep up with the memory's bytes (unpacking and a float32 multiply-add per weight, three
    instructions and more, could not). No shared memory, barrier or spill in it."""
    loop, spilled = row_gemv_loop(kind, t)
    assert not [line for line in loop if SHARED_OR_SPILL.search(line)] and spilled == 0, loop
    per_weight = len(loop) / row_gemv_weights_per_thread(t)
    assert per_weight <= MAX_INSTRUCTIONS_PER_WEIGHT[kind], (t, per_weight)


WIDE_GEMV_SIGNATURE = ROW_GEMV_SIGNATURE | {"k_per_split": "i32", "stride_os": "i32"}
QWEN3_8B_PRODUCTS = ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (5120, 2048), (2048, 4096))
# the rule's tiles at Qwen3-8B's (and -30B-A3B's) one-row products, and variants the sweep tries: loads in order, 4
# rows by 4 loads of each, 8 rows, two warps (8 rows by 2 loads a thread spill with zero points: not swept; 4 rows by 4
# loads in order spill 88 bytes with offsets: not here)
WIDE_GEMV_TILES = sorted({wide_gemv_tiles(n, k) for n, k in QWEN3_8B_PRODUCTS} | {
    WideGemvTiles(4, 2048, 1, 1, 2, True), WideGemvTiles(4, 4096, 1, 1, 1), WideGemvTiles(8, 1024, 1, 1, 2, True),
    WideGemvTiles(8, 2048, 2, 1, 1), WideGemvTiles(4, 4096, 2, 1, 2)}, key=repr)
MAX_WIDE_INSTRUCTIONS_PER_WEIGHT = {"symmetric": 3.0, "zeros": 3.25, "offsets": 3.7}  # x's scaling, not prefetches
LOAD_128 = re.compile(r"\bLDG\.E\.128(?:\.\w+)*\s+R(\d+)")


def _registers(line: str) -> tuple[int | None, set[int]]:
    """The register a SASS instruction writes first (None for stores, prefetches, branches) and those it reads."""
    op, _, operands = re.sub(r"^@!?P\w+\s+", "", line).partition(" ")
    has_dest = not op.startswith(("ST", "CCTL", "RED", "BRA", "EXIT")) and "," in operands
    dest, _, sources = operands.partition(",") if has_dest else ("", "", operands)
    first = re.match(r"\s*R(\d+)", dest)
    return (int(first.group(1)) if first else None), {int(r) for r in re.findall(r"\bR(\d+)\b", sources)}


def first_use(body: list[str], loads: set[int]) -> int:
    """The index of the first instruction that reads a register one of the 16-byte loads at `loads` wrote (and
    nothing rewrote since), len(body) if none."""
    written: set[int] = set()
    for i, line in enumerate(body):
        dest, sources = _registers(line)
        if written & sources:
            return i
        if i in loads:
            written |= set(range(int(LOAD_128.search(line).group(1)), int(LOAD_128.search(line).group(1)) + 4))
        elif dest is not None:
            written.discard(dest)
    return len(body)


def loads_before_first_use(body: list[str]) -> int:
    """The 16-byte loads a loop body issues before it first uses one."""
    loads = {i for i, line in enumerate(body) if LOAD_128.search(line)}
    return sum(i < first_use(body, loads) for i in loads)


def wide_gemv_loop(kind: str, group: int, t: WideGemvTiles) -> tuple[list[str], int]:
    """(the SASS of the wide row GEMV's loop less its NOPs, spilled bytes), x in bf16, as the wrapper launches it."""
    kernel = int4_wide_gemv._int4_wide_gemv_kernel
    constexprs = row_gemv_constexprs(group, kind) | dict(
        HAS_BIAS=False, IS_PARTIAL=t.split_k > 1, EVEN_K=True, USE_PDL=True, PREFETCH=t.prefetch, IN_ORDER=t.in_order,
        BLOCK_N=t.block_n, BLOCK_K=t.block_k)
    signature = {name: WIDE_GEMV_SIGNATURE[name] for name in kernel.arg_names if name not in constexprs}
    signature["out_ptr"] = "*fp32" if t.split_k > 1 else "*bf16"
    compiled = compiled_as_launched(kernel, signature, constexprs, t.num_warps, 1,
                                    frozenset({"K", "num_words", "stride_qn", "k_per_split"}), enable_fp_fusion=True)
    (loop,) = loop_bodies(cubin_sass(compiled))
    return [line for line in loop if line != "NOP"], spilled_bytes(compiled)


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize("t", WIDE_GEMV_TILES, ids=repr)
@pytest.mark.parametrize(("kind", "group"), [("symmetric", 128), ("zeros", 128), ("offsets", 32)])
def test_wide_gemv_keeps_loads_in_flight(t: WideGemvTiles, kind: str, group: int) -> None:
    """The wide row GEMV's loop reads weights and x in 16-byte loads, fetches the tile `prefetch` ahead into L2 (one
    prefetch a 16-byte load: a line each; the group values' before the loop), issues few instructions per weight,
    and touches no shared memory, waits at no barrier, spills nothing. Where its loads are in order, every weight
    load issues before any is used; else x's first 32 columns and a weight load at least (ptxas spreads the others
    over the iteration, each a wait on L2 where the tile was fetched ahead)."""
    loop, spilled = wide_gemv_loop(kind, group, t)
    assert not [line for line in loop if SHARED_OR_SPILL.search(line)] and spilled == 0, loop
    loads_per_row = t.block_k // (1024 * t.num_warps)
    assert sum(bool(LOAD_128.search(line)) for line in loop) == (t.block_n + 4) * loads_per_row
    if t.in_order:  # the weights' volatile loads, x's first pair again (volatile), then any use of the weights
        weights = {i for i, line in enumerate(loop) if LOAD_128.search(line) and ".STRONG" in line}
        (token,) = [i for i, line in enumerate(loop) if re.search(r"\bLDG\.E\.STRONG", line)]
        assert len(weights) == t.block_n * loads_per_row and max(weights) < token < first_use(loop, weights), loop
    else:
        assert loads_before_first_use(loop) >= 5, loop
    prefetches = t.block_n * loads_per_row if t.prefetch else 0  # the group values' before the loop
    assert sum("CCTL.E.PF2" in line for line in loop) == prefetches
    per_weight = (len(loop) - prefetches) / (t.block_n * loads_per_row * 32)
    assert per_weight <= MAX_WIDE_INSTRUCTIONS_PER_WEIGHT[kind], (t, kind, per_weight)


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
def test_row_gemv_loop_issues_its_next_tile_last() -> None:
    """Why the wide row GEMV prefetches into L2: the row GEMV's loop issues only x's loads before it first uses one
    (its next tile's words come last, just before the branch: ptxas sinks them), so each iteration waits on words
    loaded at the end of the one before."""
    loop, _ = row_gemv_loop("symmetric", GemvTiles(1, 4, 2048, 4))
    assert loads_before_first_use(loop) == 4
    loads = [i for i, line in enumerate(loop) if LOAD_128.search(line)]
    assert loads[4] > 0.75 * len(loop), loads


FP8_ROW_GEMV_TABLE_TILES = sorted({(n, k, tiles) for (kind, rows, n, k), tiles in
                                   quant_gemm_configs.TABLES["H100"].items()
                                   if kind == "fp8" and quant_gemm_configs.runs_row_gemv(tiles)}, key=repr)
FP8_ROW_GEMV_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "bias_ptr": "*bf16",
                          "out_ptr": "*bf16"}
# SASS, per thread, in the loop at the H100 table's tiles (the float32 GEMV of quant_gemv.py: 8.5 to 12)
MAX_FP8_INSTRUCTIONS_PER_WEIGHT = 4.2


def fp8_row_gemv_loop(t: GemvTiles) -> tuple[list[str], int, int]:
    """(the SASS of the FP8 row GEMV's loop less its NOPs, spilled bytes, weights a thread multiplies a pass) at
    128x128 block scales and x in bf16, launched as fp8_row_gemv launches it."""
    kernel = fp8_row_gemv._fp8_row_gemv_kernel
    block_n, block_k, num_warps = fp8_row_gemv.launch_shape(t)
    constexprs = dict(SCALE_ROWS=128, GROUP=128, BLOCK_SCALES=True, HAS_BIAS=False, EVEN_K=True, USE_PDL=True,
                      BLOCK_N=block_n, BLOCK_K=block_k)
    signature = {name: FP8_ROW_GEMV_SIGNATURE.get(name, "i32") for name in kernel.arg_names if name not in constexprs}
    compiled = compiled_as_launched(kernel, signature, constexprs, num_warps, 1, frozenset({"K", "stride_wn"}),
                                    enable_fp_fusion=True)
    (loop,) = loop_bodies(cubin_sass(compiled))
    weights = block_n * block_k // (32 * num_warps)
    return [line for line in loop if line != "NOP"], spilled_bytes(compiled), weights


@pytest.mark.skipif(not CUOBJDUMP.exists(), reason="triton without its NVIDIA backend's tools")
@pytest.mark.parametrize(("n", "k", "t"), FP8_ROW_GEMV_TABLE_TILES)
def test_fp8_row_gemv_issues_few_instructions_per_weight(n: int, k: int, t: GemvTiles) -> None:
    """At the H100 table's one-row FP8 tiles the loop issues at most MAX_FP8_INSTRUCTIONS_PER_WEIGHT instructions
    per weight (a conversion per pair, a packed multiply-add per pair, x's scaling shared by the rows): two
    conversions and a float32 multiply-add per weight could not keep up with the memory. One cvt.rn.f16x2.e4m3x2
    (F2FP ... E4M3) per pair; no shared memory, barrier or spill in the loop."""
    loop, spilled, weights = fp8_row_gemv_loop(t)
    assert not [line for line in loop if SHARED_OR_SPILL.search(line)] and spilled == 0, loop
    assert sum("E4M3" in line for line in loop) == weights // 2
    assert len(loop) / weights <= MAX_FP8_INSTRUCTIONS_PER_WEIGHT, (n, k, len(loop) / weights)


if __name__ == "__main__":  # python -m tests.unit.test_kernels_compile_for_hopper: the counts the bounds above hold
    for t in ROW_GEMV_SWEPT_TILES:
        counts = {kind: len(row_gemv_loop(kind, t)[0]) for kind in ("symmetric", "zeros")}
        print(t, {kind: round(count / row_gemv_weights_per_thread(t), 2) for kind, count in counts.items()})
    for t in WIDE_GEMV_TILES:
        for kind, group in (("symmetric", 128), ("zeros", 128), ("offsets", 32)):
            loop, _ = wide_gemv_loop(kind, group, t)
            weights = t.block_n * t.block_k // (32 * t.num_warps)
            print(t, kind, round((len(loop) - sum("CCTL" in line for line in loop)) / weights, 2),
                  loads_before_first_use(loop), sum(bool(LOAD_128.search(line)) for line in loop))
    for n, k, t in FP8_ROW_GEMV_TABLE_TILES:
        loop, _, weights = fp8_row_gemv_loop(t)
        print("fp8", n, k, t, round(len(loop) / weights, 2))
