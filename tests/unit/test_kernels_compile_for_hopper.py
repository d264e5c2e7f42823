"""The attention kernels with every variant switch on, and the elementwise kernels in Gemma's forms, compiled ahead
of time for Hopper (sm_90) with Triton's own compiler and ptxas, on a machine without a GPU: what Triton's
interpreter accepts and its compiler refuses (a global read that is not a constexpr, a construct the code generator
lacks) fails here rather than on the first GPU run. tests/gpu/ runs them."""

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gpu.kernels import decode_attention, prefill_attention, qk_norm_rope, rms_norm, silu_and_mul  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
FLOATS = {"scale_log2", "softcap_in", "softcap_out", "eps"}


def compile_for_hopper(kernel: object, pointers: dict[str, str], constexprs: dict[str, object]) -> None:
    names = kernel.arg_names  # type: ignore[attr-defined]
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name in FLOATS else "i32")
                 for name in names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constexprs.items()})
    assert triton.compile(source, target=HOPPER).asm["ptx"]


ATTENTION = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", block_tables_ptr="*i32",
                 context_lens_ptr="*i32", row_order_ptr="*i32", sinks_ptr="*fp32", out_ptr="*bf16",
                 partial_out_ptr="*fp32", partial_lse_ptr="*fp32", query_start_loc_ptr="*i32")
VARIANT_FLAGS = dict(HAS_WINDOW=True, HAS_SINKS=True, HAS_SOFTCAP=True)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_decode_kernels_with_every_variant_switch(num_splits: int) -> None:
    compile_for_hopper(decode_attention._decode_split_kernel, ATTENTION, dict(
        GROUP=8, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_H=16, BLOCK_D=64, BLOCK_N=64, NUM_SPLITS=num_splits,
        DOT_PRECISION="tf32", HAS_ROW_ORDER=True, USE_PDL=False, **VARIANT_FLAGS))
    compile_for_hopper(decode_attention._decode_reduce_kernel, ATTENTION, dict(
        HEAD_DIM=64, BLOCK_D=64, NUM_SPLITS=8, HAS_SINKS=True, USE_PDL=False))


def test_prefill_kernel_with_every_variant_switch() -> None:
    compile_for_hopper(prefill_attention._prefill_kernel, ATTENTION, dict(
        GROUP=4, HEAD_DIM=256, BLOCK_SIZE=16, BLOCK_M=64, BLOCK_Q=16, BLOCK_D=256, BLOCK_N=64, DOT_PRECISION="tf32",
        **VARIANT_FLAGS))


def test_elementwise_kernels_in_gemmas_forms() -> None:
    compile_for_hopper(rms_norm._rms_norm_kernel, dict(
        x_ptr="*bf16", residual_ptr="*bf16", weight_ptr="*bf16", out_ptr="*bf16", sum_ptr="*bf16"), dict(
        HIDDEN=640, BLOCK=1024, HAS_RESIDUAL=True, WEIGHT_OFFSET=1.0, SCALES_IN_FLOAT32=True, USE_PDL=False))
    compile_for_hopper(qk_norm_rope._qk_norm_rope_kernel, dict(
        qkv_ptr="*bf16", positions_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", q_weight_ptr="*bf16",
        k_weight_ptr="*bf16", q_out_ptr="*bf16", k_out_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
        slot_mapping_ptr="*i64"), dict(
        NUM_HEADS=4, NUM_KV_HEADS=1, HEAD_DIM=256, BLOCK_H=4, HAS_NORM=True, WEIGHT_OFFSET=1.0,
        SCALES_IN_FLOAT32=True, STORE_KV=True, USE_PDL=False))
    compile_for_hopper(silu_and_mul._silu_and_mul_kernel, dict(x_ptr="*bf16", out_ptr="*bf16"), dict(
        INTERMEDIATE=2048, BLOCK=1024, IS_GELU_TANH=True, USE_PDL=False))
