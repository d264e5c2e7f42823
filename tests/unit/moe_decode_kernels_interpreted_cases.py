"""Cases for the MoE decode kernels (gpu/kernels/moe_decode.py) under Triton's interpreter on the CPU, run by
tests/unit/test_attention_kernels_interpreted.py in a process with TRITON_INTERPRET=1: against gpu/layers/moe.py's
torch reference at 1 to 4 tokens, top k 1 to 4, with and without biases, SiLU and the clamped SwiGLU, with and without
a shared experts' `add`, K in one tile or several with a partial last one, columns past the last column tile, the
down kernel's slots in groups (float32 partial sums and a second pass); and fused_moe.fused_experts's choice of them
and of their tiles (a GPU's table over the rule, for its key only). float32 (exact products: only the order of the
sums differs) and float16 (the interpreter's bfloat16 is not numpy's; tests/gpu/test_fused_moe.py checks bf16 on
CUDA)."""

from types import ModuleType

import pytest
import torch

import gpu.kernels.fused_moe as fused_moe
import gpu.kernels.moe_decode as moe_decode
from gpu.kernels import fused_moe_configs
from gpu.kernels.fused_moe_configs import (
    DecodeConfig,
    DecodeTiles,
    decode_config,
    decode_tiles,
    default_decode_config,
    uses_decode_path,
)
from gpu.kernels.moe_route import route
from gpu.layers.moe import RoutedTokens, activation, experts_reference
from tests.moe_cases import cast, random_experts, random_routing
from tests.unit.moe_kernels_interpreted_cases import DECODE_ROUTINGS, LOGITS

NUM_EXPERTS, HIDDEN, INTERMEDIATE = 16, 48, 40  # neither a power of two: partial K tiles and column tiles


@pytest.fixture
def decode() -> ModuleType:
    return moe_decode


@pytest.fixture
def fused() -> ModuleType:
    return fused_moe


def run(decode: ModuleType, num_tokens: int, top_k: int, act: str, has_bias: bool, has_add: bool,
        dtype: torch.dtype = torch.float32, seed: int = 0,
        config: DecodeConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the decode kernels' output in `dtype`, the reference's in float32 on the same rounded weights and inputs)."""
    torch.set_grad_enabled(False)
    experts = cast(random_experts(NUM_EXPERTS, HIDDEN, INTERMEDIATE, act, has_bias, seed=seed), dtype)
    routed = random_routing(num_tokens, NUM_EXPERTS, top_k, seed=seed + 1)
    generator = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(num_tokens, HIDDEN, generator=generator).to(dtype)
    add = torch.randn(num_tokens, HIDDEN, generator=generator).to(dtype) if has_add else None
    out = decode.decode_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                                activation(experts.spec), experts.gate_up_proj_bias, experts.down_proj_bias, add=add,
                                config=config)
    reference = experts_reference(x.float(), cast(experts, torch.float32),
                                  RoutedTokens(routed.weights, routed.expert_ids.long()))
    return out, reference if add is None else reference + add.float()


def assert_close(out: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and out.shape == reference.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    scale = reference.abs().max().item() + 1
    torch.testing.assert_close(out.float(), reference, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize(("num_tokens", "top_k", "act", "has_bias", "has_add"), [
    (1, 1, "silu", False, False),
    (1, 4, "silu", False, True),
    (2, 2, "clamped_swiglu", True, False),
    (3, 3, "silu", True, True),
    (4, 4, "clamped_swiglu", True, True),
    (4, 2, "silu", False, False),
])
def test_decode_kernels_match_the_torch_reference(decode: ModuleType, num_tokens: int, top_k: int, act: str,
                                                  has_bias: bool, has_add: bool) -> None:
    out, reference = run(decode, num_tokens, top_k, act, has_bias, has_add, seed=num_tokens * 10 + top_k)
    assert_close(out, reference, torch.float32)


@pytest.mark.parametrize("tiles", [DecodeTiles(8, 16), DecodeTiles(16, 32)])
def test_several_k_tiles_and_partial_column_tiles(decode: ModuleType, tiles: DecodeTiles) -> None:
    # K 48 and 40 in tiles of 16 or 32 (a partial last one for 40 / 16 and 48 / 32); 40 and 48 columns in tiles of 16
    out, reference = run(decode, 3, 2, "clamped_swiglu", True, True, seed=tiles.block_n,
                         config=DecodeConfig(tiles, tiles))
    assert_close(out, reference, torch.float32)


@pytest.mark.parametrize(("num_tokens", "top_k", "slot_groups", "has_add"), [
    (1, 4, 2, True), (1, 4, 4, False), (2, 2, 2, True), (3, 4, 2, False),
])
def test_slot_groups_sum_to_the_reference(decode: ModuleType, num_tokens: int, top_k: int, slot_groups: int,
                                          has_add: bool) -> None:
    config = DecodeConfig(DecodeTiles(16, 32, num_warps=2, num_stages=1), DecodeTiles(8, 16, slot_groups=slot_groups))
    out, reference = run(decode, num_tokens, top_k, "clamped_swiglu", True, has_add, seed=slot_groups, config=config)
    assert_close(out, reference, torch.float32)
    out, reference = run(decode, num_tokens, top_k, "silu", False, has_add, torch.float16, seed=5, config=config)
    assert_close(out, reference, torch.float16)  # the partial sums stay float32: still one rounding of the output


def test_slot_groups_must_divide_top_k(decode: ModuleType) -> None:
    with pytest.raises(ValueError, match="slot_groups 4 does not divide top k 2"):
        run(decode, 1, 2, "silu", False, False, config=DecodeConfig(DecodeTiles(8, 16), DecodeTiles(8, 16, 1, 3, 4)))


def test_float16_rounds_the_intermediate_and_the_output_once_each(decode: ModuleType) -> None:
    out, reference = run(decode, 2, 3, "silu", True, True, torch.float16, seed=7)
    assert_close(out, reference, torch.float16)


def test_fused_experts_takes_the_decode_kernels_at_a_few_tokens_only(fused: ModuleType) -> None:
    experts = random_experts(NUM_EXPERTS, HIDDEN, INTERMEDIATE, "silu", seed=3)
    calls: list[int] = []
    original = fused.decode_experts

    def counted(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return original(x, *args)

    torch.set_grad_enabled(False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused, "decode_experts", counted)
        for num_tokens in (1, 2, 3):  # top 2 of 16 experts: pairs up to an eighth of them, 2, take the GEMVs
            routed = random_routing(num_tokens, NUM_EXPERTS, 2, seed=num_tokens)
            x = torch.randn(num_tokens, HIDDEN, generator=torch.Generator().manual_seed(num_tokens))
            out = fused.fused_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                                      activation(experts.spec))
            assert_close(out, experts_reference(x, experts, RoutedTokens(routed.weights, routed.expert_ids.long())),
                         torch.float32)
    assert calls == [1]


def test_fused_experts_runs_the_decode_kernels_with_its_gpus_table(fused: ModuleType) -> None:
    experts = random_experts(NUM_EXPERTS, HIDDEN, INTERMEDIATE, "clamped_swiglu", has_bias=True, seed=4)
    entry = DecodeConfig(DecodeTiles(16, 16, num_warps=2, num_stages=1), DecodeTiles(32, 16, 8, 2, slot_groups=2))
    configs: list[DecodeConfig] = []
    original = fused.decode_experts

    def spied(*args: object) -> torch.Tensor:
        configs.append(args[-1])  # type: ignore[arg-type]
        return original(*args)

    torch.set_grad_enabled(False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(fused_moe_configs.DECODE_TABLES, "Test GPU", {(1, 2, INTERMEDIATE, HIDDEN): entry})
        patch.setattr(fused, "device_name", lambda x: "NVIDIA Test GPU")
        patch.setattr(fused, "decode_experts", spied)
        routed = random_routing(1, NUM_EXPERTS, 2, seed=4)
        x = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(4))
        out = fused.fused_experts(x, experts.gate_up_proj, experts.down_proj, routed.weights, routed.expert_ids,
                                  activation(experts.spec), experts.gate_up_proj_bias, experts.down_proj_bias)
    assert configs == [entry]
    assert_close(out, experts_reference(x, experts, RoutedTokens(routed.weights, routed.expert_ids.long())),
                 torch.float32)


def test_a_gpus_decode_table_overrides_the_rule_for_its_key_only() -> None:
    entry = DecodeConfig(DecodeTiles(4, 256, 2, 1), DecodeTiles(16, 128, 4, 2, slot_groups=8))
    rule = default_decode_config(1, 8, 768, 2048)
    assert rule == DecodeConfig(decode_tiles(8, 768, 2048), decode_tiles(1, 2048, 768)) != entry
    gpu = "NVIDIA Test GPU 80GB"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(fused_moe_configs.DECODE_TABLES, "Test GPU", {(1, 8, 768, 2048): entry})
        assert decode_config(1, 8, 768, 2048, gpu) == entry
        assert decode_config(1, 8, 768, 2048, "NVIDIA Other GPU") == rule  # another GPU
        assert decode_config(1, 8, 768, 2048) == rule  # no GPU (the interpreter)
        assert decode_config(2, 8, 768, 2048, gpu) == default_decode_config(2, 8, 768, 2048)  # other keys: the rule
        assert decode_config(1, 4, 768, 2048, gpu) == default_decode_config(1, 4, 768, 2048)
        assert decode_config(1, 8, 768, 4096, gpu) == default_decode_config(1, 8, 768, 4096)
    assert decode_config(1, 8, 768, 2048, gpu) == rule  # the entry gone with its table


def test_the_decode_rule() -> None:
    # One token's pairs never share an expert: always the GEMVs; more tokens while pairs are an eighth of the experts.
    assert uses_decode_path(1, 8, 8) and uses_decode_path(1, 2, 2)
    assert [n for n in range(1, 9) if uses_decode_path(n, 8, 128)] == [1, 2]  # Qwen3-30B-A3B
    assert [n for n in range(1, 9) if uses_decode_path(n, 4, 32)] == [1]  # gpt-oss-20b
    assert not uses_decode_path(2, 2, 8)  # Mixtral: one token only
    # Programs: columns narrowed to 8 until a step covers DECODE_PROGRAMS; K within the tile's elements.
    assert decode_tiles(8, 768, 2048) == DecodeTiles(8, 1024, 8)  # Qwen3-30B-A3B's gate/up at one token
    assert decode_tiles(1, 2048, 768) == DecodeTiles(8, 1024, 8)  # its down
    assert decode_tiles(64, 768, 2048) == DecodeTiles(64, 128, 8)
    assert decode_tiles(4, 40, 48) == DecodeTiles(8, 64, 4)


@pytest.mark.parametrize("logits_kind", ["normal", "levels"])
@pytest.mark.parametrize("num_tokens", [1, 3])
@pytest.mark.parametrize("name", DECODE_ROUTINGS)
def test_routing_in_the_gate_up_kernel_equals_the_routing_launch(decode: ModuleType, name: str, num_tokens: int,
                                                                  logits_kind: str) -> None:
    """Bit for bit: the same ids, weights and output as moe_route.route followed by decode_experts."""
    torch.set_grad_enabled(False)
    routing = DECODE_ROUTINGS[name]
    generator = torch.Generator().manual_seed(num_tokens)
    experts = random_experts(routing.num_experts, HIDDEN, INTERMEDIATE, "silu", False, seed=1)
    logits = LOGITS[logits_kind]((num_tokens, routing.num_experts), generator)
    bias = torch.randn(routing.num_experts, generator=generator) if routing.has_correction_bias else None
    x = torch.randn(num_tokens, HIDDEN, generator=generator)
    act = activation(experts.spec)
    weights, ids = route(logits, routing, bias)
    expected = decode.decode_experts(x, experts.gate_up_proj, experts.down_proj, weights, ids, act)
    out, fused_weights, fused_ids = decode.decode_routed_experts(
        x, experts.gate_up_proj, experts.down_proj, decode.RouterLogits(logits, routing, bias), act)
    assert torch.equal(fused_ids, ids) and torch.equal(fused_weights, weights)
    assert torch.equal(out, expected)
