"""The q/k norm + RoPE kernel (gpu/kernels/qk_norm_rope.py) in the form of Qwen3-Next's and Qwen3.5's gated
full-attention layers, run by Triton's interpreter on the CPU against the torch layers it replaces: queries read from
between their gates (q_proj's rows are [query; gate] per head), Gemma's (1 + w) norms, a partial rotation (the first
rotary_dim of each head turned, the rest passed through after the norm), in bf16, fp16 and float32; and the gated
layer's kernel route against its torch route, in fewer operations. Float32 agrees to rounding (the norm's sum in
another order), bf16 and fp16 to the bit but for rare elements one unit in the last place off (kernel.round_to
rounds as torch does under the interpreter too). tests/gpu/test_family_kernels.py checks the compiled kernel on CUDA.
"""

import os
import sys
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3NextConfig

from gpu.attention.backend import TorchBackend
from gpu.config import KernelConfig
from gpu.layers.attention import DecoderAttention
from gpu.layers.norm import GEMMA3_NORM, LLAMA_NORM, NormConvention, RMSNorm
from gpu.layers.rotary import RotaryEmbedding
from gpu.models.qwen3_next import gated_attention_spec

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run with TRITON_INTERPRET=1 from the start", allow_module_level=True)

from gpu.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv  # noqa: E402

TORCH_LAYERS = KernelConfig(fused_kernels=False)
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NUM_HEADS, NUM_KV_HEADS, NUM_TOKENS, MAX_POSITION = 3, 2, 5, 64
MAX_DIFFERING = 0.01  # share of bf16/fp16 elements one ulp off (a float32 sum in another order near a tie)


def rotary_of(head_dim: int, factor: float, dtype: torch.dtype) -> RotaryEmbedding:
    """The table as the model holds it after .to(dtype)."""
    config = Qwen3NextConfig(head_dim=head_dim, partial_rotary_factor=factor)
    return RotaryEmbedding(config, head_dim, MAX_POSITION).to(dtype)


def norms_of(convention: NormConvention, head_dim: int, dtype: torch.dtype, generator: torch.Generator
             ) -> tuple[RMSNorm, RMSNorm]:
    norms = (RMSNorm(head_dim, 1e-6, TORCH_LAYERS, convention), RMSNorm(head_dim, 1e-6, TORCH_LAYERS, convention))
    for norm in norms:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(head_dim, generator=generator) * 0.3 + (1 - convention.weight_offset))
    return norms[0].to(dtype), norms[1].to(dtype)


def gated_qkv(head_dim: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """[tokens, heads * [query; gate], keys, values]: the gated layers' projection."""
    width = (2 * NUM_HEADS + 2 * NUM_KV_HEADS) * head_dim
    return (2 * torch.randn(NUM_TOKENS, width, generator=generator)).to(dtype)


def torch_qk(qkv: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, norms: tuple[RMSNorm, RMSNorm],
             has_output_gate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch layers' queries and keys: split views (the queries from between their gates), norms, rotation."""
    head_dim = norms[0].weight.shape[0]
    q_width = (2 if has_output_gate else 1) * head_dim
    q = qkv[:, : NUM_HEADS * q_width].view(-1, NUM_HEADS, q_width)[..., :head_dim]
    keys = qkv[:, NUM_HEADS * q_width : NUM_HEADS * q_width + NUM_KV_HEADS * head_dim].view(-1, NUM_KV_HEADS, head_dim)
    return rotary.rotate(positions, norms[0](q)), rotary.rotate(positions, norms[1](keys))


def ulps(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How many representable values of their dtype lie between got and expected (same-sign finite values)."""
    int_type = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[got.dtype]
    return (got.view(int_type).long() - expected.view(int_type).long()).abs()


def assert_rounds_as_torch(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        return
    off = ulps(got, expected)
    assert int(off.max()) <= 1, f"{int(off.max())} ulps off"
    assert float((off > 0).float().mean()) <= MAX_DIFFERING, f"{float((off > 0).float().mean()):.2%} differ"


def random_positions(generator: torch.Generator) -> torch.Tensor:
    positions = torch.randint(0, MAX_POSITION, (NUM_TOKENS,), generator=generator)
    positions[0] = MAX_POSITION - 1  # the table's last row
    return positions


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [16, 64, 128, 256])  # 16: the tiny hybrid checkpoints' heads
@pytest.mark.parametrize("factor", [0.25, 0.5])
def test_partial_rotation_of_queries_between_gates(dtype: torch.dtype, head_dim: int, factor: float) -> None:
    generator = torch.Generator().manual_seed(head_dim + int(factor * 4))
    rotary = rotary_of(head_dim, factor, dtype)
    assert rotary.rotary_dim == int(head_dim * factor)
    norms = norms_of(GEMMA3_NORM, head_dim, dtype, generator)
    qkv, positions = gated_qkv(head_dim, dtype, generator), random_positions(generator)
    expected_q, expected_k = torch_qk(qkv, positions, rotary, norms, has_output_gate=True)
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, (NUM_HEADS, NUM_KV_HEADS, head_dim),
                        (norms[0].weight.detach(), norms[1].weight.detach()), 1e-6, norm_convention=(1.0, True),
                        has_output_gate=True)
    assert_rounds_as_torch(q, expected_q)
    assert_rounds_as_torch(k, expected_k)


def test_partial_rotation_without_gates_by_llamas_norm() -> None:
    """GLM's form: half of each head turned, Llama's norm, no gates."""
    generator = torch.Generator().manual_seed(7)
    rotary = rotary_of(128, 0.5, torch.bfloat16)
    norms = norms_of(LLAMA_NORM, 128, torch.bfloat16, generator)
    qkv, positions = gated_qkv(128, torch.bfloat16, generator), random_positions(generator)
    expected_q, expected_k = torch_qk(qkv, positions, rotary, norms, has_output_gate=False)
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, (NUM_HEADS, NUM_KV_HEADS, 128),
                        (norms[0].weight.detach(), norms[1].weight.detach()), 1e-6)
    assert_rounds_as_torch(q, expected_q)
    assert_rounds_as_torch(k, expected_k)


def test_store_kv_between_gates_writes_the_keys_and_values() -> None:
    """The keys qk_norm_rope returns and the values after them in qkv, at their slots (none for a slot of -1), from
    float32 tables."""
    generator = torch.Generator().manual_seed(8)
    head_dim, dtype = 64, torch.bfloat16
    rotary = rotary_of(head_dim, 0.25, torch.float32)
    norms = norms_of(GEMMA3_NORM, head_dim, dtype, generator)
    qkv, positions = gated_qkv(head_dim, dtype, generator), random_positions(generator)
    heads, weights = (NUM_HEADS, NUM_KV_HEADS, head_dim), (norms[0].weight.detach(), norms[1].weight.detach())
    q, k = qk_norm_rope(qkv, positions, rotary.cos, rotary.sin, heads, weights, 1e-6, norm_convention=(1.0, True),
                        has_output_gate=True)
    k_cache, v_cache = torch.zeros(2, 4, 4, NUM_KV_HEADS, head_dim, dtype=dtype)
    slots = torch.tensor([3, 9, -1, 0, 14])
    stored_q = qk_norm_rope_store_kv(qkv, positions, (rotary.cos, rotary.sin), heads, weights, 1e-6,
                                     (k_cache, v_cache, slots), norm_convention=(1.0, True), has_output_gate=True)
    values = qkv[:, (2 * NUM_HEADS + NUM_KV_HEADS) * head_dim :].view(NUM_TOKENS, NUM_KV_HEADS, head_dim)
    written = slots >= 0
    assert torch.equal(stored_q, q)
    assert torch.equal(k_cache.view(-1, NUM_KV_HEADS, head_dim)[slots[written]], k[written])
    assert torch.equal(v_cache.view(-1, NUM_KV_HEADS, head_dim)[slots[written]], values[written])
    assert int(torch.count_nonzero(v_cache)) == int(written.sum()) * NUM_KV_HEADS * head_dim


class LayerOps(TorchDispatchMode):
    """Counts the aten operations a layer issues, by name, leaving out those Triton's interpreter issues to run a
    kernel (on CUDA a launch issues none)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.interpreter_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        frame = sys._getframe(1)
        while frame is not None and f"{os.sep}triton{os.sep}" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is None:
            self.counts[func.overloadpacket.__name__] += 1
        else:
            self.interpreter_ops += 1
        return func(*args, **(kwargs or {}))


def gated_layer(dtype: torch.dtype) -> DecoderAttention:
    config = Qwen3NextConfig(hidden_size=128, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
                             head_dim=256, partial_rotary_factor=0.25, num_hidden_layers=4)
    layer = DecoderAttention(gated_attention_spec(config, 3), RotaryEmbedding(config, 256, MAX_POSITION)).to(dtype)
    generator = torch.Generator().manual_seed(9)
    for norm in (layer.q_norm, layer.k_norm):
        with torch.no_grad():
            norm.weight.copy_(torch.randn(256, generator=generator) * 0.3)  # type: ignore[union-attr]
    layer.backend = TorchBackend()
    return layer


def fresh_caches(layer: DecoderAttention) -> None:
    layer.k_cache, layer.v_cache = (torch.zeros(4, 4, NUM_KV_HEADS, 256, dtype=torch.bfloat16) for _ in range(2))


def test_gated_layers_kernel_route_is_its_torch_route_in_two_operations() -> None:
    """The route a gated layer takes on CUDA (one launch: its queries, its keys and values in the cache; its gates a
    view) gives its torch route's queries, caches and gates, with two operations of its own: the queries' allocation
    and the gates' view (the torch route, the one a gated layer took on CUDA before, issues dozens)."""
    layer = gated_layer(torch.bfloat16)
    assert layer.kernel_rotates
    generator = torch.Generator().manual_seed(10)
    qkv = (2 * torch.randn(NUM_TOKENS, (2 * NUM_HEADS + 2 * NUM_KV_HEADS) * 256, generator=generator)).bfloat16()
    positions, slots = random_positions(generator), torch.tensor([3, 9, -1, 0, 14])
    fresh_caches(layer)
    with LayerOps() as torch_ops:
        expected_q = layer._query_storing_kv(positions, qkv, slots)
    expected_caches = (layer.k_cache, layer.v_cache)
    fresh_caches(layer)
    with LayerOps() as kernel_ops:
        q = layer._fused_q_storing_kv(positions, qkv, slots)
        gate = layer._output_gate(qkv)
    assert kernel_ops.counts == {"empty": 1, "as_strided": 1} and kernel_ops.interpreter_ops > 0
    assert sum(torch_ops.counts.values()) > 40  # what the step saves
    assert_rounds_as_torch(q, expected_q)
    assert_rounds_as_torch(layer.k_cache, expected_caches[0])
    assert torch.equal(layer.v_cache, expected_caches[1])
    split_gate = qkv[:, : 2 * NUM_HEADS * 256].view(NUM_TOKENS, NUM_HEADS, 512)[..., 256:]
    assert torch.equal(gate, split_gate) and gate.data_ptr() == split_gate.data_ptr()
