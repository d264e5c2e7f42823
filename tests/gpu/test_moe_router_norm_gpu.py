"""The MoE block's input norm computed by its router's skinny GEMM (gpu/layers/moe.py `Router.forward_normed`, the
kernel's `normed_out`): the normed x the kernel writes against gpu/kernels/rms_norm.py's, and the block's output
with the fusion against the same block with it off (the norm kernel, then the router's plain product), eagerly and
in a CUDA graph, with and without programmatic dependent launch.

The prologue rule runs the fusion at one row on the H100 only; here each test sets the rule's buckets itself, so it
runs on any GPU at 1..8 rows. Inputs whose sums are exact (x + residual all +-1, eps 0, so rstd is 1; norm and router
weights of few bits) make every float32 sum order-independent: there the fused block must equal the unfused one to
the bit, since the router's logits no longer depend on which config multiplies them."""

import pytest
import torch
from transformers import PretrainedConfig

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels need CUDA", allow_module_level=True)

import gpu.kernels.pdl as pdl  # noqa: E402
import gpu.kernels.rms_norm as rms_norm_module  # noqa: E402
import gpu.kernels.skinny_gemm as skinny_module  # noqa: E402
from gpu.config import KernelConfig  # noqa: E402
from gpu.kernels.rms_norm import rms_norm  # noqa: E402
from gpu.kernels.skinny_gemm import skinny_gemm, skinny_gemm_rms_norm  # noqa: E402
from gpu.kernels.skinny_gemm_configs import SkinnyConfig  # noqa: E402
from gpu.kernels.skinny_gemm_configs import prologue_config as rule_prologue_config  # noqa: E402
from gpu.layers.moe import MoeSpec, Routing, SparseMoe  # noqa: E402
from gpu.layers.norm import NormInput, RMSNorm  # noqa: E402
from tests.gpu.graph_capture import captured  # noqa: E402

DEVICE = torch.device("cuda")
ROWS = (1, 2, 3, 5, 8)
FUSED_BUCKETS = {"norm": (1, 2, 4, 8)}


def exact_inputs(m: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, residual) in bf16 with x + residual all +-1 (mean square 1) and every value a few bits."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    signs = torch.randint(0, 2, (m, k), generator=generator, device=DEVICE) * 2 - 1
    residual = (torch.randint(-1, 2, (m, k), generator=generator, device=DEVICE) / 2)
    return (signs - residual).bfloat16(), residual.bfloat16()


def few_bits(shape: tuple[int, ...], seed: int, levels: int = 16) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randint(-levels, levels + 1, shape, generator=generator, device=DEVICE) / levels).bfloat16()


@pytest.mark.parametrize("use_pdl", [True, False])
@pytest.mark.parametrize("n,k,split_k", [(128, 2048, 1), (32, 2880, 1), (128, 2048, 2)])
def test_normed_out_is_the_norm_kernels_output_and_the_products_input(n: int, k: int, split_k: int,
                                                                       use_pdl: bool) -> None:
    for m in ROWS:
        rule = rule_prologue_config(m, k, "norm", FUSED_BUCKETS)
        assert rule is not None
        config = SkinnyConfig(rule.block_n, rule.block_k, split_k, num_warps=rule.num_warps, num_stages=1)
        w, bias = few_bits((n, k), m) * 0.25, few_bits((n,), m + 1)
        norm_weight = (1 + few_bits((k,), m + 2, 4) / 2)
        exact = exact_inputs(m, k, m)
        generator = torch.Generator(device=DEVICE).manual_seed(10 + m)
        random = tuple(torch.randn(m, k, generator=generator, device=DEVICE).bfloat16() for _ in range(2))
        for (x, residual), eps in ((exact, 0.0), (random, 1e-6)):
            normed = torch.full((m, k), float("nan"), dtype=torch.bfloat16, device=DEVICE)
            y, summed = skinny_gemm_rms_norm(x, residual, norm_weight, eps, w, bias, config, use_pdl, normed)
            ref_normed, ref_summed = rms_norm(x, norm_weight, eps, residual)
            assert torch.equal(summed, ref_summed)
            assert torch.equal(y, skinny_gemm(normed, w, bias, config))  # the same tiles in the same order
            if eps == 0.0:
                assert torch.equal(normed, ref_normed)
            else:
                assert (normed == ref_normed).float().mean().item() >= 0.99
                torch.testing.assert_close(normed, ref_normed, rtol=8e-3, atol=8e-3)


def moe_block(hidden: int, family: str) -> tuple[SparseMoe, RMSNorm]:
    """A bf16 block with random expert weights and a router of few-bit weights: Qwen3-MoE's plain softmax router,
    Qwen3-Next's shared experts and their gate, or gpt-oss's router bias and expert biases."""
    if family == "gpt_oss":
        spec = MoeSpec(Routing(16, 4, "top_k_softmax", has_bias=True), 64, "clamped_swiglu", has_expert_bias=True)
    elif family == "qwen3_next":
        spec = MoeSpec(Routing(16, 4), 64, shared_intermediate_size=96, has_shared_expert_gate=True)
    else:
        spec = MoeSpec(Routing(16, 4, renormalize=False), 64)
    block = SparseMoe(PretrainedConfig(hidden_size=hidden, hidden_act="silu"), spec, KernelConfig())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5)
        block.gate.weight.copy_(torch.randint(-8, 9, block.gate.weight.shape, generator=generator) / 32)
        if block.gate.bias is not None:
            block.gate.bias.copy_(torch.randint(-8, 9, block.gate.bias.shape, generator=generator) / 8)
    norm = RMSNorm(hidden, 0.0)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randint(-2, 3, (hidden,), generator=generator) / 4)
    return block.to(DEVICE, torch.bfloat16).requires_grad_(False), norm.to(DEVICE, torch.bfloat16).requires_grad_(False)


@pytest.fixture
def norm_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels that compute a norm (the fused product, the norm kernel), as they are called."""
    calls: list[str] = []
    for module, name in ((skinny_module, "skinny_gemm_rms_norm"), (rms_norm_module, "rms_norm")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or
                            _real(*a, **kw))
    return calls


def run_block(block: SparseMoe, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor, buckets: dict,
              monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(output, residual stream, the norm kernels it called) with the prologue rule's buckets set to `buckets`."""
    monkeypatch.setattr(skinny_module, "prologue_buckets_for", lambda name: buckets)
    calls.clear()
    out, summed = block(NormInput(norm, x, residual))
    return out, summed, list(calls)


@pytest.mark.parametrize("use_pdl", [True, False])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_next", "gpt_oss"])
def test_fused_block_equals_the_unfused_block(family: str, use_pdl: bool, monkeypatch: pytest.MonkeyPatch,
                                              norm_calls: list[str]) -> None:
    """Eagerly: one kernel (no norm kernel) where the rule fuses, and the unfused block's output to the bit."""
    if not use_pdl:
        monkeypatch.setattr(pdl, "_supports_pdl", lambda index: False)
    block, norm = moe_block(256, family)
    for m in ROWS:
        x, residual = exact_inputs(m, 256, 100 + m)
        fused, fused_sum, fused_calls = run_block(block, norm, x, residual, FUSED_BUCKETS, monkeypatch, norm_calls)
        apart, apart_sum, apart_calls = run_block(block, norm, x, residual, {}, monkeypatch, norm_calls)
        assert (fused_calls, apart_calls) == (["skinny_gemm_rms_norm"], ["rms_norm"])
        assert torch.equal(fused_sum, apart_sum) and torch.equal(fused, apart), family


@pytest.mark.parametrize("use_pdl", [True, False])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_next"])
def test_fused_block_in_a_cuda_graph_follows_new_inputs(family: str, use_pdl: bool, monkeypatch: pytest.MonkeyPatch,
                                                        norm_calls: list[str]) -> None:
    """Captured with the fusion, replayed on new inputs: the experts read the normed x this replay's router kernel
    wrote (not a stale one), equal to the unfused block run eagerly."""
    if not use_pdl:
        monkeypatch.setattr(pdl, "_supports_pdl", lambda index: False)
    block, norm = moe_block(256, family)
    for m in (1, 4):
        x, residual = exact_inputs(m, 256, 7)
        graph, (out, summed, calls) = captured(
            lambda x=x, residual=residual: run_block(block, norm, x, residual, FUSED_BUCKETS, monkeypatch, norm_calls))
        assert calls == ["skinny_gemm_rms_norm"]
        for seed in (1, 2):
            new_x, new_residual = exact_inputs(m, 256, 1000 * m + seed)
            x.copy_(new_x)
            residual.copy_(new_residual)
            graph.replay()
            apart, apart_sum, _ = run_block(block, norm, new_x, new_residual, {}, monkeypatch, norm_calls)
            assert torch.equal(summed, apart_sum) and torch.equal(out, apart)


def test_random_inputs_stay_close(monkeypatch: pytest.MonkeyPatch, norm_calls: list[str]) -> None:
    """Any inputs (sums in another order: the norm may differ in a last bit): within bf16's tolerance."""
    block, norm = moe_block(2048, "qwen3_moe")
    norm.eps = 1e-6
    for m in ROWS:
        x, residual = (torch.randn(m, 2048, device=DEVICE).bfloat16() for _ in range(2))
        fused, fused_sum, _ = run_block(block, norm, x, residual, FUSED_BUCKETS, monkeypatch, norm_calls)
        apart, apart_sum, _ = run_block(block, norm, x, residual, {}, monkeypatch, norm_calls)
        assert torch.equal(fused_sum, apart_sum)
        torch.testing.assert_close(fused, apart, rtol=2e-2, atol=2e-2 * (apart.abs().max().item() + 1))
