"""The MoE layer's parts (gpu/layers/moe.py) against transformers' own modules, float32 on CPU: each family's
router picks the same experts with the same weights, and stacked experts (loaded per expert or from a stacked
checkpoint tensor, whole or as one tensor-parallel rank's share) give the same outputs."""

from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

from gpu.distributed import TensorParallel
from gpu.layers.moe import Experts, MoeSpec, RoutedTokens, Router, Routing, experts_reference
from gpu.loader import CheckpointTensor, ExpertShard, expert_target

NUM_TOKENS, HIDDEN = 37, 32


def hf_router_and_routing(family: str) -> tuple[torch.nn.Module, Routing]:
    """A transformers router of `family` with random weights, and the Routing our families read from its config."""
    torch.manual_seed(0)
    if family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=16, num_experts_per_tok=4,
                                             norm_topk_prob=False)
        module = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter(config)
        return module, Routing(16, 4, renormalize=False)
    if family == "mixtral":
        config = transformers.MixtralConfig(hidden_size=HIDDEN, num_local_experts=8, num_experts_per_tok=2)
        return transformers.models.mixtral.modeling_mixtral.MixtralTopKRouter(config), Routing(8, 2)
    if family == "glm4_moe":  # 4 groups of 8, the best 2 groups eligible, the top 6 of them, scaled
        config = transformers.Glm4MoeConfig(hidden_size=HIDDEN, n_routed_experts=32, num_experts_per_tok=6, n_group=4,
                                            topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
        module = transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeTopkRouter(config)
        module.e_score_correction_bias.normal_(0.0, 0.5)
        return module, Routing(32, 6, "sigmoid", True, 4, 2, 2.5, has_correction_bias=True, float32_logits=True)
    config = transformers.GptOssConfig(hidden_size=HIDDEN, num_local_experts=8, num_experts_per_tok=4)
    module = transformers.models.gpt_oss.modeling_gpt_oss.GptOssTopKRouter(config)
    return module, Routing(8, 4, "top_k_softmax", has_bias=True)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "glm4_moe", "gpt_oss"])
def test_routers_choose_as_transformers_does(family: str) -> None:
    hf, routing = hf_router_and_routing(family)
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0.0, 0.5)
        ours = Router(HIDDEN, routing)
        ours.weight.copy_(hf.weight)
        if routing.has_bias:
            ours.bias.copy_(hf.bias)
        if routing.has_correction_bias:
            ours.e_score_correction_bias.copy_(hf.e_score_correction_bias)
        x = torch.randn(NUM_TOKENS, HIDDEN)
        routed = ours(x)
        _, hf_weights, hf_ids = hf(x)
    order, hf_order = routed.expert_ids.argsort(dim=-1), hf_ids.argsort(dim=-1)  # sorted=False: compare as sets
    assert torch.equal(routed.expert_ids.gather(1, order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(routed.weights.gather(1, order), hf_weights.float().gather(1, hf_order),
                               rtol=0, atol=0)


def test_group_limited_routing_only_picks_from_the_best_groups() -> None:
    _, routing = hf_router_and_routing("glm4_moe")
    router = Router(HIDDEN, routing)
    with torch.no_grad():
        router.weight.normal_()
        router.e_score_correction_bias.zero_()
        routed = router(torch.randn(NUM_TOKENS, HIDDEN))
    groups_used = (routed.expert_ids // 8).sort(dim=-1).values
    assert all(len(set(row.tolist())) <= 2 for row in groups_used)
    assert len({tuple(row.tolist()) for row in groups_used}) > 1, "different tokens use different groups"


def test_a_float32_router_stays_float32_when_the_model_is_cast() -> None:
    _, routing = hf_router_and_routing("glm4_moe")
    router = Router(HIDDEN, routing).to(torch.bfloat16)
    assert router.weight.dtype == torch.float32 and router.e_score_correction_bias.dtype == torch.float32
    other = Router(HIDDEN, Routing(8, 2)).to(torch.bfloat16)
    assert other.weight.dtype == torch.bfloat16


def checkpoint(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, CheckpointTensor]:
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path))
    with safe_open(str(path), framework="pt") as f:
        return {name: CheckpointTensor(name, f.get_slice(name)) for name in f.keys()}  # noqa: SIM118


def load(experts: Experts, tensors: dict[str, CheckpointTensor], parts: dict[str, str]) -> None:
    params = dict(experts.named_parameters())
    loaded: dict[str, set] = {}
    for name, tensor in tensors.items():
        target = expert_target(f"mlp.experts.{name}", parts)
        param_name, shard = (target[0].removeprefix("mlp.experts."), target[1]) if target else (name, None)
        params[param_name].weight_loader(params[param_name], tensor, shard)
        # As gpu/loader.py counts them: a stacked tensor (no shard) is every shard at once.
        loaded.setdefault(param_name, set()).update(experts.expected_shards(params[param_name]) if shard is None
                                                    else {shard})
    assert all(loaded[n] == experts.expected_shards(p) for n, p in params.items()), "every shard loaded once"


def random_routing(num_experts: int, top_k: int) -> RoutedTokens:
    ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(NUM_TOKENS)])
    return RoutedTokens(torch.rand(NUM_TOKENS, top_k), ids)


def ranks(size: int) -> list[TensorParallel]:
    if size == 1:
        return [TensorParallel()]
    return [TensorParallel(rank, size, group=object()) for rank in range(size)]  # type: ignore[arg-type]


@pytest.mark.parametrize("is_stacked", [False, True])
@pytest.mark.parametrize("tp_size", [1, 2])
def test_per_expert_or_stacked_tensors_give_transformers_experts(tmp_path: Path, tp_size: int,
                                                                 is_stacked: bool) -> None:
    """Per-expert tensors (Hub checkpoints), or transformers' own stacked layout (newer checkpoints ship it)."""
    config = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=6, moe_intermediate_size=24)
    torch.manual_seed(1)
    hf = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts(config)
    with torch.no_grad():
        hf.gate_up_proj.normal_()
        hf.down_proj.normal_()
    size = config.moe_intermediate_size
    tensors = checkpoint(tmp_path / "experts.safetensors", dict(hf.named_parameters()) if is_stacked else {
        **{f"{e}.gate_proj.weight": hf.gate_up_proj[e, :size] for e in range(6)},
        **{f"{e}.up_proj.weight": hf.gate_up_proj[e, size:] for e in range(6)},
        **{f"{e}.down_proj.weight": hf.down_proj[e] for e in range(6)},
    })
    x, routed = torch.randn(NUM_TOKENS, HIDDEN), random_routing(6, 2)
    spec = MoeSpec(Routing(6, 2), size)
    total = torch.zeros(NUM_TOKENS, HIDDEN)
    for tp in ranks(tp_size):
        experts = Experts(HIDDEN, spec, tp)
        load(experts, tensors, {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"})
        total += experts_reference(x, experts, routed)
    with torch.no_grad():
        expected = hf(x, routed.expert_ids, routed.weights)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_stacked_interleaved_tensors_give_gpt_oss_experts(tmp_path: Path, tp_size: int) -> None:
    config = transformers.GptOssConfig(hidden_size=HIDDEN, num_local_experts=4, intermediate_size=20)
    torch.manual_seed(2)
    hf = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_()
    tensors = checkpoint(tmp_path / "experts.safetensors", dict(hf.named_parameters()))
    x, routed = torch.randn(NUM_TOKENS, HIDDEN), random_routing(4, 2)
    spec = MoeSpec(Routing(4, 2, "top_k_softmax", has_bias=True), 20, "clamped_swiglu", config.swiglu_alpha,
                   config.swiglu_limit, has_expert_bias=True, is_gpt_oss_layout=True)
    total = torch.zeros(NUM_TOKENS, HIDDEN)
    for tp in ranks(tp_size):
        experts = Experts(HIDDEN, spec, tp)
        load(experts, tensors, {})
        total += experts_reference(x, experts, routed)
    with torch.no_grad():
        expected = hf(x, routed.expert_ids, routed.weights)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


def test_the_capturable_form_of_the_reference_sums_the_same() -> None:
    """Every expert over every token, weighted by zero where not routed (what a CUDA graph can capture)."""
    from gpu.layers.moe import _experts_over_every_token

    torch.manual_seed(3)
    spec = MoeSpec(Routing(8, 3), 24, "clamped_swiglu", has_expert_bias=True)
    experts = Experts(HIDDEN, spec)
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_()
        x, routed = torch.randn(NUM_TOKENS, HIDDEN), random_routing(8, 3)
        torch.testing.assert_close(_experts_over_every_token(x, experts, routed), experts_reference(x, experts, routed),
                                   rtol=1e-5, atol=1e-5)


def test_expert_tensor_names() -> None:
    parts = {"w1": "gate", "w3": "up", "w2": "down"}
    assert expert_target("model.layers.0.mlp.experts.12.w3.weight", parts) == (
        "model.layers.0.mlp.experts.gate_up_proj", ExpertShard("up", 12))
    assert expert_target("model.layers.0.mlp.experts.1.w2.weight", parts) == (
        "model.layers.0.mlp.experts.down_proj", ExpertShard("down", 1))
    assert expert_target("model.layers.0.mlp.shared_experts.gate_proj.weight", parts) is None
    assert expert_target("model.layers.0.mlp.experts.gate_up_proj", parts) is None  # stacked: its own name
    assert expert_target("model.layers.0.mlp.experts.5.w1.weight_scale_inv", parts) == (
        "model.layers.0.mlp.experts.gate_up_proj_scale_inv", ExpertShard("gate", 5))  # a quantized format's tensor



def test_gpt_oss_experts_in_fp8_are_refused_by_name() -> None:
    """MXFP4 experts load (gpu/quant/mxfp4.py); FP8 ones load one tensor per expert only, not gpt-oss's stacked
    tensors: an error that names the format."""
    from gpu.models.gpt_oss import GptOssForCausalLM
    from gpu.quant import quant_scheme, quantize_layers

    config = transformers.GptOssConfig(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16, num_local_experts=4, intermediate_size=16,
                                       vocab_size=32, quantization_config={"quant_method": "fp8",
                                                                           "weight_block_size": [16, 16]})
    with pytest.raises(ValueError, match="FP8 experts are supported with block scales .*one tensor per expert"):
        quantize_layers(GptOssForCausalLM(config, 64), quant_scheme(config))
