"""The fused elementwise kernels (rms_norm, qk_norm_rope, silu_and_mul) against the torch code of
gpu/layers/, which is their reference, on CUDA; and whole models with the fused path on and off.

Skips cleanly without triton or CUDA. Every case draws fresh random inputs. Before each kernel call
the caching allocator is handed a NaN-filled block of the output's size, so an output element the
kernel never writes shows up as NaN. The kernels round where the torch code rounds, so float32
agrees to a few ulps, and bf16/fp16 agree to one unit of the last place on the rare elements where
a float32 sum in another order lands on the other side of a rounding boundary.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

from transformers import LlamaConfig  # noqa: E402

from core.config import engine_config  # noqa: E402
from core.engine import runner_config  # noqa: E402
from core.tiny_model import TinyModelSpec, build_tiny_model  # noqa: E402
from gpu.attention import torch_ref  # noqa: E402
from gpu.attention.metadata import AttentionMetadata  # noqa: E402
from gpu.config import KernelConfig  # noqa: E402
from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv  # noqa: E402
from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.kernels.silu_and_mul import silu_and_mul  # noqa: E402
from gpu.layers.activation import SiluAndMul  # noqa: E402
from gpu.layers.norm import RMSNorm  # noqa: E402
from gpu.layers.rotary import RotaryEmbedding  # noqa: E402
from gpu.model_runner import ModelRunner  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402

DEVICE = torch.device("cuda")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Elementwise tolerance: a few ulps of float32; one ulp of bf16/fp16 at the outputs' magnitudes (<~8).
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 6.3e-2, torch.float16: 8e-3}
# Share of elements allowed to differ at all in bf16/fp16 (rounding-boundary cases only).
MAX_DIFFERING = 0.02
TORCH_LAYERS = KernelConfig(fused_kernels=False)  # the layers' torch code, the kernels' reference, on CUDA


def poison_allocator(like_numel: int, dtype: torch.dtype) -> None:
    """The next allocation of this size reuses a block full of NaN: unwritten outputs show."""
    block = torch.full((like_numel,), float("nan"), dtype=dtype, device=DEVICE)
    del block


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, label: str) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{label}: {out.shape} {out.dtype} vs {ref.shape}"
    assert not out.isnan().any(), f"{label}: output elements left unwritten (NaN)"
    diff = (out.float() - ref.float()).abs()
    differing = (diff > 0).float().mean().item()
    print(f"{label}: max_abs_err={diff.max().item():.2e} differing={differing:.2%}")
    tol = TOLERANCES[out.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    if out.dtype != torch.float32:
        assert differing <= MAX_DIFFERING, f"{label}: {differing:.2%} of elements differ"


def random_weight(size: int, dtype: torch.dtype) -> torch.Tensor:
    return (1.0 + 0.5 * torch.randn(size, device=DEVICE)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 1000, 1024, 4096])
@pytest.mark.parametrize("num_tokens", [1, 300])
@pytest.mark.parametrize("has_residual", [True, False])
def test_rms_norm_matches_reference(dtype: torch.dtype, hidden: int, num_tokens: int, has_residual: bool) -> None:
    norm = RMSNorm(hidden, 1e-6, TORCH_LAYERS).to(DEVICE, dtype)
    norm.weight.data = random_weight(hidden, dtype)
    # x is a strided view (row stride wider than hidden), as a slice of a larger buffer would be.
    x = (3 * torch.randn(num_tokens, hidden + 16, device=DEVICE)).to(dtype)[:, :hidden]
    residual = torch.randn(num_tokens, hidden, device=DEVICE).to(dtype) if has_residual else None
    ref_normed, ref_sum = norm.forward_with_residual(x, residual)
    poison_allocator(num_tokens * hidden, dtype)
    normed, summed = rms_norm(x, norm.weight, norm.eps, residual)
    label = f"rms_norm {dtype} hidden={hidden} tokens={num_tokens} residual={has_residual}"
    assert_close_to_reference(normed, ref_normed, label)
    assert torch.equal(summed, ref_sum), f"{label}: the residual sum must equal the torch add exactly"


def test_rms_norm_layer_routes_to_the_kernel() -> None:
    """With the flag on, the layer on CUDA gives the kernel's result bit for bit; with it off, the torch one."""
    norm = RMSNorm(512, 1e-5).to(DEVICE, torch.bfloat16)
    norm.weight.data = random_weight(512, torch.bfloat16)
    x, residual = torch.randn(2, 9, 512, device=DEVICE).to(torch.bfloat16).unbind(0)
    fused = norm.forward_with_residual(x, residual)
    expected = rms_norm(x, norm.weight, 1e-5, residual)
    assert all(torch.equal(a, b) for a, b in zip(fused, expected, strict=True))
    assert torch.equal(norm(x), rms_norm(x, norm.weight, 1e-5)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("intermediate", [64, 96, 3072, 11008])
@pytest.mark.parametrize("num_tokens", [1, 333])
def test_silu_and_mul_matches_reference(dtype: torch.dtype, intermediate: int, num_tokens: int) -> None:
    x = (2 * torch.randn(num_tokens, 2 * intermediate, device=DEVICE)).to(dtype)
    reference = SiluAndMul(TORCH_LAYERS)
    poison_allocator(num_tokens * intermediate, dtype)
    out = silu_and_mul(x)
    assert_close_to_reference(out, reference(x), f"silu_and_mul {dtype} I={intermediate} tokens={num_tokens}")


# (num_heads, num_kv_heads, head_dim): Qwen3-0.6B, a 64-dim GQA, MQA, 256-dim.
HEAD_SHAPES = [(16, 8, 128), (12, 4, 64), (8, 1, 128), (4, 2, 256)]
MAX_POSITION = 8192


def reference_qk(
    qkv: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, heads: tuple[int, int, int],
    norms: tuple[RMSNorm, RMSNorm] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What DecoderAttention's torch path does: split views, per-head RMSNorm, then RoPE."""
    num_heads, num_kv_heads, head_dim = heads
    q = qkv[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(-1, num_kv_heads, head_dim)
    if norms is not None:
        q, k = norms[0](q), norms[1](k)
    return rotary(positions, q, k)


def random_positions(num_tokens: int) -> torch.Tensor:
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), device=DEVICE)
    positions[0] = MAX_POSITION - 1  # the table's last row
    if num_tokens > 1:
        positions[1] = 0
    return positions


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEAD_SHAPES, ids=str)
@pytest.mark.parametrize("has_norm", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 257])
def test_qk_norm_rope_matches_reference(
    dtype: torch.dtype, heads: tuple[int, int, int], has_norm: bool, num_tokens: int
) -> None:
    num_heads, num_kv_heads, head_dim = heads
    config = LlamaConfig(head_dim=head_dim, rope_theta=1_000_000.0)
    rotary = RotaryEmbedding(config, head_dim, MAX_POSITION).to(DEVICE, dtype)  # as model.to(dtype) leaves it
    norms = None
    if has_norm:
        norms = (RMSNorm(head_dim, 1e-6).to(DEVICE, dtype), RMSNorm(head_dim, 1e-6).to(DEVICE, dtype))
        for norm in norms:
            norm.weight.data = random_weight(head_dim, dtype)
    width = (num_heads + 2 * num_kv_heads) * head_dim  # queries, keys, values: the fused projection
    qkv = (2 * torch.randn(num_tokens, width, device=DEVICE)).to(dtype)
    positions = random_positions(num_tokens)
    ref_q, ref_k = reference_qk(qkv, positions, rotary, heads, norms)
    poison_allocator(num_tokens * num_heads * head_dim, dtype)
    weights = (norms[0].weight, norms[1].weight) if norms is not None else None
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, heads, weights, 1e-6)
    label = f"qk_norm_rope {dtype} heads={heads} norm={has_norm} tokens={num_tokens}"
    assert_close_to_reference(q, ref_q, label + " q")
    assert_close_to_reference(k, ref_k, label + " k")


def test_qk_norm_rope_float32_tables_and_strided_qkv() -> None:
    """float32 cos/sin with bf16 activations (rounded in the kernel), and a qkv with a wider row stride."""
    heads = (16, 8, 128)
    rotary32 = RotaryEmbedding(LlamaConfig(head_dim=128), 128, MAX_POSITION).to(DEVICE)
    rotary16 = RotaryEmbedding(LlamaConfig(head_dim=128), 128, MAX_POSITION).to(DEVICE, torch.bfloat16)
    qkv = torch.randn(40, 32 * 128 + 64, device=DEVICE).to(torch.bfloat16)[:, : 32 * 128]
    positions = random_positions(40)
    ref_q, ref_k = reference_qk(qkv, positions, rotary16, heads, None)
    q, k = qk_norm_rope(qkv, positions, rotary32.cos, rotary32.sin, heads)
    assert torch.equal(q, ref_q) and torch.equal(k, ref_k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("heads", HEAD_SHAPES, ids=str)
@pytest.mark.parametrize("has_norm", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 257])
def test_qk_norm_rope_store_kv_equals_qk_norm_rope_then_store_kv(
    dtype: torch.dtype, heads: tuple[int, int, int], has_norm: bool, num_tokens: int
) -> None:
    """The same q, and the caches written as store_kv writes qk_norm_rope's k and the values (padding tokens,
    slot -1, write nothing): bit for bit."""
    num_heads, num_kv_heads, head_dim = heads
    rotary = RotaryEmbedding(LlamaConfig(head_dim=head_dim), head_dim, MAX_POSITION).to(DEVICE, dtype)
    weights = (random_weight(head_dim, dtype), random_weight(head_dim, dtype)) if has_norm else None
    qkv = (2 * torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE)).to(dtype)
    positions = random_positions(num_tokens)
    block_size, num_blocks = 16, -(-num_tokens // 16) + 2
    slot_mapping = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slot_mapping[torch.rand(num_tokens, device=DEVICE) < 0.2] = -1
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, device=DEVICE).to(dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, heads, weights, 1e-6)
    values = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    torch_ref.store_kv(k, values, expected_k, expected_v, slot_mapping)
    poison_allocator(num_tokens * num_heads * head_dim, dtype)
    fused_q = qk_norm_rope_store_kv(qkv, positions, (rotary.cos, rotary.sin), heads, weights, 1e-6,
                                    (k_cache, v_cache, slot_mapping))
    assert torch.equal(fused_q, q)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_kernels_replay_in_a_cuda_graph() -> None:
    """Captured once; inputs change in place between replays, outputs follow."""
    dtype, heads, hidden = torch.bfloat16, (16, 8, 128), 1024
    rotary = RotaryEmbedding(LlamaConfig(head_dim=128), 128, MAX_POSITION).to(DEVICE, dtype)
    weight = random_weight(hidden, dtype)
    x, residual = torch.randn(2, 8, hidden, device=DEVICE).to(dtype).unbind(0)
    qkv = torch.randn(8, 32 * 128, device=DEVICE).to(dtype)
    positions = random_positions(8)

    def step() -> tuple[torch.Tensor, ...]:
        normed, summed = rms_norm(x, weight, 1e-6, residual)
        q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, heads, (weight[:128], weight[128:256]))
        return normed, summed, q, k, silu_and_mul(qkv)

    graph, outputs = captured(step)
    for _ in range(3):
        for tensor in (x, residual, qkv):
            tensor.copy_(torch.randn_like(tensor, dtype=torch.float32).to(dtype))
        positions.copy_(random_positions(8))
        graph.replay()
        for out, expected in zip(outputs, step(), strict=True):
            assert torch.equal(out, expected)


# Whole models: the fused path against the torch path, same weights, same attention backend.

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fused-models")
    specs = {
        "qwen3": TinyModelSpec(architecture="qwen3"),
        "qwen3-d128": TinyModelSpec(architecture="qwen3", hidden_size=256, num_heads=4, num_kv_heads=2,
                                    head_dim=128, intermediate_size=512, num_layers=3),
        "llama": TinyModelSpec(architecture="llama", tie_word_embeddings=False, num_kv_heads=1, seed=1),
        "qwen2": TinyModelSpec(architecture="qwen2", num_kv_heads=4, seed=2),
    }
    return {name: build_tiny_model(root / name, spec) for name, spec in specs.items()}


def prefill_then_decode_logits(runner: ModelRunner, prompt_len: int) -> torch.Tensor:
    """Logits of every prompt token (one prefill) and of one decode step after it; [prompt_len + 1, vocab]. Every
    KV-cache group keeps the context in its first blocks (a windowed one frees none: its kernels mask the window)."""
    model, block_size = runner.model, runner.config.block_size
    num_blocks = -(-(prompt_len + 1) // block_size)
    assert all(group.num_blocks >= num_blocks for group in runner.kv_cache_groups)
    tables = torch.arange(num_blocks, dtype=torch.int32, device=DEVICE)[None]
    num_other_groups = len(runner.kv_cache_groups) - 1

    def step(ids: torch.Tensor, positions: torch.Tensor, is_decode: bool) -> torch.Tensor:
        n, context = ids.shape[0], int(positions[-1]) + 1
        meta = AttentionMetadata(
            slot_mapping=positions.clone(), query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
            context_lens=torch.tensor([context], dtype=torch.int32, device=DEVICE), block_tables=tables,
            max_query_len=n, max_context_len=context, is_decode_only=is_decode,
        )
        meta = meta.with_group_tables([meta.slot_mapping] * num_other_groups, [tables] * num_other_groups)
        return model.compute_logits(model(ids, positions, meta)).float()

    generator = torch.Generator(device=DEVICE).manual_seed(prompt_len)
    ids = torch.randint(0, runner.vocab_size, (prompt_len + 1,), device=DEVICE, generator=generator)
    positions = torch.arange(prompt_len + 1, device=DEVICE)
    prefill = step(ids[:prompt_len], positions[:prompt_len], is_decode=False)
    decode = step(ids[prompt_len:], positions[prompt_len:], is_decode=True)
    return torch.cat([prefill, decode])


def model_logits(model_dir: Path, dtype: str, is_fused: bool) -> torch.Tensor:
    config = replace(runner_config(engine_config(
        str(model_dir), dtype=dtype, device="cuda", kv_cache_blocks=64, max_num_seqs=4, max_model_len=512,
        enforce_eager=True, attention_backend="triton")), kernels=KernelConfig(fused_kernels=is_fused))
    runner = ModelRunner(config)
    with torch.inference_mode():
        return prefill_then_decode_logits(runner, prompt_len=300)


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative Frobenius error, share of rows with the same argmax)."""
    rel = ((out - ref).norm() / ref.norm()).item()
    return rel, (out.argmax(-1) == ref.argmax(-1)).float().mean().item()


@pytest.mark.parametrize("model", ["qwen3", "qwen3-d128", "llama", "qwen2"])
def test_model_logits_fused_vs_torch_path_float32(model_dirs: dict[str, Path], model: str) -> None:
    fused, reference = (model_logits(model_dirs[model], "float32", is_fused) for is_fused in (True, False))
    rel, same_top1 = compare(fused, reference)
    print(f"model {model} float32: rel_err={rel:.2e} max_abs_err={(fused - reference).abs().max().item():.2e}")
    assert rel < 1e-5 and same_top1 == 1.0


@pytest.mark.parametrize("model", ["qwen3", "qwen3-d128", "llama", "qwen2"])
def test_model_logits_fused_bf16_is_as_accurate_as_torch_path(model_dirs: dict[str, Path], model: str) -> None:
    """Two bf16 paths that differ in rare roundings drift apart through the layers; what matters is that
    the fused one is no further from the float32 logits than the torch one is."""
    exact = model_logits(model_dirs[model], "float32", is_fused=False)
    fused, reference = (model_logits(model_dirs[model], "bfloat16", is_fused) for is_fused in (True, False))
    (fused_rel, fused_top1), (torch_rel, torch_top1) = compare(fused, exact), compare(reference, exact)
    between_rel, between_top1 = compare(fused, reference)
    print(f"model {model} bf16 vs float32: fused rel_err={fused_rel:.2e} top1={fused_top1:.2%}, torch path "
          f"rel_err={torch_rel:.2e} top1={torch_top1:.2%}; fused vs torch path rel_err={between_rel:.2e} "
          f"top1={between_top1:.2%}")
    assert fused_rel <= 1.25 * torch_rel + 1e-3
    assert fused_top1 >= torch_top1 - 0.02
    assert between_rel < 5e-2

