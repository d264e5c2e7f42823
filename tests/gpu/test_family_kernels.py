"""The fused elementwise kernels in the newer families' forms against the torch layers they replace, on CUDA:
RMSNorm by Gemma 3's and Gemma 4's conventions, Gemma's q/k norm + RoPE (with and without writing K/V to the
cache), Qwen3-Next's and Qwen3.5's (queries between their gates, a partial rotation) and their gated layer's q/k path
in one launch, GELU-tanh-and-mul; and whole Gemma models (norms, activation, windows) with the fused path on and off
(tests/gpu/test_fused_kernels.py's rules: float32 to rounding, bf16 no further from float32 than the torch path).
"""

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from transformers import Gemma3TextConfig, Qwen3NextConfig  # noqa: E402

from core.tiny_model import TinyModelSpec, build_tiny_model, has_architecture  # noqa: E402
from gpu.attention.backend import TorchBackend  # noqa: E402
from gpu.config import DEFAULT_KERNELS, KernelConfig  # noqa: E402
from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv  # noqa: E402
from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.kernels.silu_and_mul import gated_activation  # noqa: E402
from gpu.layers.activation import GeluTanhAndMul  # noqa: E402
from gpu.layers.attention import DecoderAttention  # noqa: E402
from gpu.layers.norm import GEMMA3_NORM, GEMMA4_NORM, RMSNorm  # noqa: E402
from gpu.layers.rotary import RotaryEmbedding  # noqa: E402
from gpu.models.qwen3_next import gated_attention_spec  # noqa: E402
from tests.gpu import test_fused_kernels as fused  # noqa: E402
from tests.gpu.test_fused_kernels import DEVICE, DTYPES, TORCH_LAYERS, assert_close_to_reference  # noqa: E402
from tests.unit.test_linear_states import CountedOps  # noqa: E402

CONVENTIONS = {"gemma3": GEMMA3_NORM, "gemma4": GEMMA4_NORM}


def norm_of(name: str, size: int, dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(size, 1e-6, TORCH_LAYERS, CONVENTIONS[name]).to(DEVICE, dtype)
    norm.weight.data = (0.3 * torch.randn(size, device=DEVICE)).to(dtype)  # Gemma 3: scale 1 + w
    return norm


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONVENTIONS))
@pytest.mark.parametrize("hidden", [640, 2560])
@pytest.mark.parametrize("has_residual", [True, False])
def test_rms_norm_by_convention(dtype: torch.dtype, name: str, hidden: int, has_residual: bool) -> None:
    norm = norm_of(name, hidden, dtype)
    x = (3 * torch.randn(300, hidden, device=DEVICE)).to(dtype)
    residual = torch.randn(300, hidden, device=DEVICE).to(dtype) if has_residual else None
    ref_normed, ref_sum = norm.forward_with_residual(x, residual)
    fused.poison_allocator(300 * hidden, dtype)
    convention = norm.convention
    normed, summed = rms_norm(x, norm.weight, norm.eps, residual, weight_offset=convention.weight_offset,
                              scales_in_float32=convention.scales_in_float32)
    assert_close_to_reference(normed, ref_normed, f"rms_norm {name} {dtype} hidden={hidden}")
    assert torch.equal(summed, ref_sum)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens", [1, 257])
def test_qk_norm_rope_by_gemma_convention(dtype: torch.dtype, num_tokens: int) -> None:
    heads = (4, 1, 256)  # Gemma 3 270M
    config = Gemma3TextConfig(head_dim=256)
    rotary = RotaryEmbedding(config, 256, fused.MAX_POSITION, "sliding_attention").to(DEVICE, dtype)
    norms = (norm_of("gemma3", 256, dtype), norm_of("gemma3", 256, dtype))
    qkv = (2 * torch.randn(num_tokens, 6 * 256, device=DEVICE)).to(dtype)
    positions = fused.random_positions(num_tokens)
    ref_q, ref_k = fused.reference_qk(qkv, positions, rotary, heads, norms)
    weights = (norms[0].weight, norms[1].weight)
    fused.poison_allocator(num_tokens * 4 * 256, dtype)
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, heads, weights, 1e-6, norm_convention=(1.0, True))
    assert_close_to_reference(q, ref_q, f"qk_norm_rope gemma3 {dtype} q")
    assert_close_to_reference(k, ref_k, f"qk_norm_rope gemma3 {dtype} k")
    k_cache, v_cache = torch.zeros(2, -(-num_tokens // 16), 16, 1, 256, device=DEVICE, dtype=dtype)
    slots = torch.arange(num_tokens, device=DEVICE)
    fused_q = qk_norm_rope_store_kv(qkv, positions, (rotary.cos, rotary.sin), heads, weights, 1e-6,
                                    (k_cache, v_cache, slots), norm_convention=(1.0, True))
    assert torch.equal(fused_q, q) and torch.equal(k_cache.view(-1, 1, 256)[:num_tokens], k)


# (num_heads, num_kv_heads, head_dim, partial_rotary_factor): Qwen3-Next's and Qwen3.5's gated layers, a half rotation
# of 128-dim heads, the tiny hybrid checkpoints' heads.
GATED_SHAPES = [(16, 2, 256, 0.25), (8, 1, 128, 0.5), (4, 2, 16, 0.25)]


def gated_rotary(head_dim: int, factor: float, dtype: torch.dtype) -> RotaryEmbedding:
    config = Qwen3NextConfig(head_dim=head_dim, partial_rotary_factor=factor)
    return RotaryEmbedding(config, head_dim, fused.MAX_POSITION).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", GATED_SHAPES, ids=str)
@pytest.mark.parametrize("num_tokens", [1, 257])
def test_qk_norm_rope_between_gates_with_a_partial_rotation(dtype: torch.dtype, shape: tuple[int, int, int, float],
                                                            num_tokens: int) -> None:
    num_heads, num_kv_heads, head_dim, factor = shape
    heads = (num_heads, num_kv_heads, head_dim)
    rotary = gated_rotary(head_dim, factor, dtype)
    norms = (norm_of("gemma3", head_dim, dtype), norm_of("gemma3", head_dim, dtype))
    qkv = (2 * torch.randn(num_tokens, (2 * num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE)).to(dtype)
    positions = fused.random_positions(num_tokens)
    queries = qkv[:, : 2 * num_heads * head_dim].view(num_tokens, num_heads, 2 * head_dim)[..., :head_dim]
    keys = qkv[:, 2 * num_heads * head_dim : (2 * num_heads + num_kv_heads) * head_dim]
    ref_q, ref_k = rotary(positions, norms[0](queries), norms[1](keys.view(num_tokens, num_kv_heads, head_dim)))
    weights = (norms[0].weight, norms[1].weight)
    fused.poison_allocator(num_tokens * num_heads * head_dim, dtype)
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, heads, weights, 1e-6, norm_convention=(1.0, True),
                        has_output_gate=True)
    label = f"qk_norm_rope gated {dtype} {shape} tokens={num_tokens}"
    assert_close_to_reference(q, ref_q, label + " q")
    assert_close_to_reference(k, ref_k, label + " k")
    k_cache, v_cache = torch.zeros(2, -(-num_tokens // 16), 16, num_kv_heads, head_dim, device=DEVICE, dtype=dtype)
    slots = torch.arange(num_tokens, device=DEVICE)
    fused_q = qk_norm_rope_store_kv(qkv, positions, (rotary.cos, rotary.sin), heads, weights, 1e-6,
                                    (k_cache, v_cache, slots), norm_convention=(1.0, True), has_output_gate=True)
    values = qkv[:, (2 * num_heads + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    assert torch.equal(fused_q, q) and torch.equal(k_cache.view(-1, num_kv_heads, head_dim)[:num_tokens], k)
    assert torch.equal(v_cache.view(-1, num_kv_heads, head_dim)[:num_tokens], values)


def gated_layer(kernels: KernelConfig) -> DecoderAttention:
    """Qwen3-Next's gated full-attention layer (one rank's heads of the 80B), bf16 on CUDA, with empty caches."""
    config = Qwen3NextConfig(hidden_size=512, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                             partial_rotary_factor=0.25, num_hidden_layers=4)
    rotary = RotaryEmbedding(config, 256, fused.MAX_POSITION)
    layer = DecoderAttention(gated_attention_spec(config, 3), rotary, kernels).to(DEVICE, torch.bfloat16)
    layer.backend = TorchBackend()
    layer.k_cache, layer.v_cache = (torch.zeros(32, 16, 2, 256, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    return layer


@torch.inference_mode()  # as the runner runs the layers
def test_gated_layers_q_k_path_is_one_launch() -> None:
    """A prompt step's queries, keys and values of a gated layer: one launch and the queries' allocation (its torch
    path issues dozens of operations, each paid in host time outside CUDA graphs), as its torch layers compute them."""
    fused_layer, torch_layer = gated_layer(DEFAULT_KERNELS), gated_layer(TORCH_LAYERS)
    for norm in (fused_layer.q_norm, fused_layer.k_norm):
        norm.weight.data = (0.3 * torch.randn(256, device=DEVICE)).to(torch.bfloat16)  # type: ignore[union-attr]
    torch_layer.load_state_dict(fused_layer.state_dict())
    qkv = (2 * torch.randn(300, (2 * 16 + 2 * 2) * 256, device=DEVICE)).to(torch.bfloat16)
    positions, slots = fused.random_positions(300), torch.randperm(32 * 16, device=DEVICE)[:300]
    with CountedOps() as ops:
        q = fused_layer._query_storing_kv(positions, qkv, slots)
    assert ops.counts == {"empty": 1}, ops.counts
    expected_q = torch_layer._query_storing_kv(positions, qkv, slots)
    assert_close_to_reference(q, expected_q, "gated layer q")
    assert_close_to_reference(fused_layer.k_cache, torch_layer.k_cache, "gated layer k_cache")
    assert torch.equal(fused_layer.v_cache, torch_layer.v_cache)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("intermediate", [2048, 96])
@pytest.mark.parametrize("num_tokens", [1, 333])
def test_gelu_tanh_and_mul(dtype: torch.dtype, intermediate: int, num_tokens: int) -> None:
    x = (2 * torch.randn(num_tokens, 2 * intermediate, device=DEVICE)).to(dtype)
    fused.poison_allocator(num_tokens * intermediate, dtype)
    out = gated_activation(x, "gelu_tanh")
    assert_close_to_reference(out, GeluTanhAndMul(TORCH_LAYERS)(x), f"gelu_tanh_and_mul {dtype} I={intermediate}")


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma-models")
    specs = {
        "gemma3": TinyModelSpec(architecture="gemma3", num_layers=3, hidden_size=256, num_heads=4, num_kv_heads=1,
                                head_dim=256, intermediate_size=512, perturbs_norms=True,
                                overrides=(("sliding_window", 128), ("query_pre_attn_scalar", 256))),
        "gemma4": TinyModelSpec(architecture="gemma4", num_layers=4, perturbs_norms=True, overrides=(
            ("sliding_window", 128), ("layer_types", ["sliding_attention", "full_attention"] * 2),
            ("global_head_dim", 32), ("num_kv_shared_layers", 2), ("hidden_size_per_layer_input", 8))),
    }
    return {name: build_tiny_model(root / name, spec) for name, spec in specs.items()
            if has_architecture(spec.architecture)}


@pytest.mark.parametrize("model", ["gemma3", "gemma4"])
def test_gemma_logits_fused_vs_torch_path(gemma_dirs: dict[str, Path], model: str) -> None:
    if model not in gemma_dirs:
        pytest.skip(f"this transformers has no {model} model class")
    exact, reference = (fused.model_logits(gemma_dirs[model], "float32", is_fused) for is_fused in (True, False))
    rel, same_top1 = fused.compare(exact, reference)
    assert rel < 1e-5 and same_top1 == 1.0, f"float32 rel_err={rel:.2e}"
    bf16, bf16_reference = (fused.model_logits(gemma_dirs[model], "bfloat16", is_fused) for is_fused in (True, False))
    (fused_rel, fused_top1), (torch_rel, torch_top1) = fused.compare(bf16, exact), fused.compare(bf16_reference, exact)
    print(f"model {model} bf16 vs float32: fused rel_err={fused_rel:.2e} top1={fused_top1:.2%}, torch path "
          f"rel_err={torch_rel:.2e} top1={torch_top1:.2%}")
    assert fused_rel <= 1.25 * torch_rel + 1e-3
    assert fused_top1 >= torch_top1 - 0.02
