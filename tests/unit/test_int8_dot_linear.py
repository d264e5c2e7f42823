"""The integer dot-product forms (gpu/layers/int8_dot_linear.py, gpu/cpu_kernels/int8_dot.c) against float products.

Each is checked twice: exactly (to float32 rounding) against the float64 product of the same int8-quantized
activations with the dequantized weights (a 4-bit group's minimum times the float sum of its activations), and within
the bound the activations' quantization allows against the float product itself (half a step, largest magnitude /
127 / 256, per activation of a group). Every instruction set this
CPU can run is built and checked: its own (`native`, e.g. AVX512-VNNI) and AVX2's (Haswell), whose kernels differ.
"""

import pytest
import torch

from gpu.cpu_kernels import build
from gpu.layers.activation import GatedActivation, GeluTanhAndMul, SiluAndMul
from gpu.layers.cpu_linear import CpuPacking, int4_grid, int8_grid
from gpu.layers.int8_dot_linear import GROUP_SIZE, Int4DotGroups, Int8DotGroups
from gpu.layers.norm import GEMMA3_NORM, RMSNorm
from tests.unit.test_cpu_linear import q4_1_round_trip, q4_k_like, q5_0_round_trip, q6_k_like, q8_0_round_trip

TARGETS = ["native", "haswell"]  # this CPU's instruction set; AVX2 without VNNI


@pytest.fixture(scope="module", params=TARGETS)
def kernels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a module
    built = build.load("int8_dot", str(tmp_path_factory.getbasetemp()), march=request.param)
    if built.module is None:
        pytest.skip(f"the int8 dot-product kernels are not built for {request.param}: {built.reason}")
    return built.module


def _random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel multiplies it: each group of 32 as 256 * q1 + q2 steps of its largest magnitude / (127 * 256),
    q1 = round(x / step1) with step1 = largest / 127, q2 = round of the remainder in 256ths of step1."""
    groups = x.float().view(*x.shape[:-1], -1, GROUP_SIZE)
    largest = groups.abs().amax(-1, keepdim=True)
    exact = groups * torch.where(largest > 0, 127 / largest, 0.0)
    first = exact.round()
    second = ((exact - first) * 256).round().clamp(-127, 127)
    return ((256 * first + second) * (largest / 127 / 256)).view(x.shape)


def quantization_bound(x: torch.Tensor, stepped: torch.Tensor) -> torch.Tensor:
    """[rows, out]: how far the product of x's quantized activations with `stepped` (the weights' levels times their
    scales) can be from the float one: half a step (largest magnitude / 127 / 256) per activation."""
    half_steps = x.float().view(x.shape[0], -1, GROUP_SIZE).abs().amax(-1) / (254 * 256)  # [rows, groups]
    weight_sums = stepped.abs().view(stepped.shape[0], -1, GROUP_SIZE).sum(-1)  # [out, groups]
    return half_steps @ weight_sums.T


def group_minimums(weight: torch.Tensor) -> torch.Tensor:
    """[out, in]: each 4-bit group's minimum, the part of its weights the kernel multiplies by float activations."""
    groups = weight.view(weight.shape[0], -1, GROUP_SIZE)
    return groups.amin(-1, keepdim=True).expand_as(groups).reshape(weight.shape)


def check_product(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  minimums: torch.Tensor | None = None, normed_input: bool = False) -> None:
    """y against x @ weight.T (+ bias), `minimums` [out, in]: a 4-bit weight's group minimums. `normed_input`: x is
    what the torch layer computed as the product's input, which the kernel computed itself (the same operations,
    its sums in another order): compared by the bound alone, with a float32 rounding's margin per input."""
    x = x.float()
    minimums = torch.zeros_like(weight) if minimums is None else minimums
    stepped = weight - minimums
    exact = (quantized_activations(x).double() @ stepped.double().T + x.double() @ minimums.double().T).float()
    if bias is not None:
        exact += bias.float()
    scale = exact.abs().amax()
    if normed_input:
        input_rounding = 2**-8 if x.dtype == torch.bfloat16 else 1e-6
        bound = quantization_bound(x, stepped) + input_rounding * (x.abs() @ weight.abs().T) + 2**-8 * scale
        assert ((y.float() - (x @ weight.T + (0 if bias is None else bias.float()))).abs() <= bound).all()
        return
    if y.dtype == torch.bfloat16:  # one rounding of the output
        torch.testing.assert_close(y.float(), exact, rtol=2**-8, atol=2**-8 * scale.item())
    else:
        torch.testing.assert_close(y, exact, rtol=1e-5, atol=1e-5 * scale.item())
    reference = x @ weight.T + (0 if bias is None else bias.float())
    rounding = 2**-8 * scale if y.dtype == torch.bfloat16 else 1e-5 * scale
    assert ((y.float() - reference).abs() <= quantization_bound(x, stepped) + rounding).all()


ROWS = [1, 3, 4, 5, 37]  # one, a partial chunk of 4, a chunk, a chunk and one, a prompt's


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kind", ["q4_1", "q4_k", "q8_0", "q5_0", "q6_k"])
def test_groups_equal_the_product_of_quantized_activations(kernels, kind: str, rows: int) -> None:  # noqa: ANN001
    """A Q4_1 weight as 4-bit groups (with their minimums), a Q4_K one too with its float32 scales, a Q8_0 one as
    8-bit groups, a Q5_0 one as 8-bit groups on its own float16 step (levels -16..15), a Q6_K one as 8-bit groups with
    a float32 scale per half group."""
    if kind.startswith("q4"):
        weight = q4_1_round_trip(_random(64, 160) * 0.05) if kind == "q4_1" else q4_k_like(64, 256, seed=rows)
        packed = Int4DotGroups.pack(kernels, *int4_grid(weight))  # type: ignore[misc]
        assert packed is not None
        scale_dtype = packed._tensors[1].dtype  # noqa: SLF001 - the scales as the kernel reads them
        assert scale_dtype == (torch.float16 if kind == "q4_1" else torch.float32)
    elif kind == "q6_k":
        weight = q6_k_like(48, 256, seed=rows)[0]
        packed = Int8DotGroups.pack(kernels, *int8_grid(weight))  # type: ignore[misc]
        assert packed is not None and packed._tensors[1].shape == (48 // kernels.TILE_ROWS, 16, kernels.TILE_ROWS)  # noqa: SLF001
    else:
        weight = (q8_0_round_trip if kind == "q8_0" else q5_0_round_trip)(_random(48, 96) * 0.05)
        packed = Int8DotGroups.pack(kernels, *int8_grid(weight))  # type: ignore[misc]
    assert packed is not None
    x = _random(rows, weight.shape[1], seed=rows)
    check_product(packed(x, None), x, weight, minimums=group_minimums(weight) if kind.startswith("q4") else None)


def test_extreme_levels_and_activations_do_not_overflow(kernels) -> None:  # noqa: ANN001
    """Every 8-bit level at +-127 against activations at their group's largest magnitude (AVX2 sums pairs in int16),
    and 4-bit levels at 15: the sums stay exact."""
    signs = torch.where(_random(32, 64) > 0, 1.0, -1.0)
    levels = (127 * signs).to(torch.int32)
    x = signs[:3].clone()  # the products all +127 on rows 0..2 of the weight
    packed = Int8DotGroups.pack(kernels, levels, torch.ones(32, 2))
    assert packed is not None
    check_product(packed(x, None), x, levels.float())
    four_bit = Int4DotGroups.pack(kernels, torch.full((32, 64), 15), torch.ones(32, 2), torch.zeros(32, 2))
    assert four_bit is not None
    check_product(four_bit(x.abs(), None), x.abs(), torch.full((32, 64), 15.0), minimums=torch.zeros(32, 64))


def test_bfloat16_activations_strided_rows_and_a_bias(kernels) -> None:  # noqa: ANN001
    weight = q4_1_round_trip(_random(32, 64) * 0.05)
    packed = Int4DotGroups.pack(kernels, *int4_grid(weight))  # type: ignore[misc]
    assert packed is not None
    wide = _random(5, 96, seed=3)
    x = wide[:, 16:80]  # rows 96 apart
    bias = _random(32, seed=4)
    check_product(packed(x, bias), x, weight, bias, group_minimums(weight))
    y = packed(x.bfloat16(), bias.bfloat16())
    assert y.dtype == torch.bfloat16
    check_product(y, x.bfloat16(), weight, bias.bfloat16(), group_minimums(weight))


def test_a_zero_group_gives_zero(kernels) -> None:  # noqa: ANN001
    weight = q8_0_round_trip(_random(16 * 2, 64) * 0.05)
    packed = Int8DotGroups.pack(kernels, *int8_grid(weight))  # type: ignore[misc]
    assert packed is not None
    x = _random(2, 64)
    x[:, :GROUP_SIZE] = 0.0  # a group of zeros: scale 0, no division by it
    check_product(packed(x, None), x, weight)


def test_shapes_the_kernel_cannot_take_stay_unpacked(kernels) -> None:  # noqa: ANN001
    rows = kernels.TILE_ROWS * 2 + kernels.TILE_ROWS // 2
    weight = q4_1_round_trip(_random(rows, 64) * 0.05)
    assert Int4DotGroups.pack(kernels, *int4_grid(weight)) is None  # type: ignore[misc]
    packing = CpuPacking(torch.float32, kernels)
    assert packing.pack(weight) is None  # float32: F.linear on the weight as loaded
    assert packing.pack(_random(32, 64)) is None  # off every grid


def test_the_packing_finds_each_grid(kernels) -> None:  # noqa: ANN001
    packing = CpuPacking(torch.float32, kernels)
    assert isinstance(packing.pack(q4_1_round_trip(_random(32, 64))), Int4DotGroups)
    assert isinstance(packing.pack(q8_0_round_trip(_random(32, 64))), Int8DotGroups)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("has_residual", [False, True], ids=["first layer", "residual"])
def test_a_norm_before_the_product_equals_the_norm_layer(kernels, dtype: torch.dtype,  # noqa: ANN001
                                                         has_residual: bool) -> None:
    """RMSNorm(x + residual) computed by the kernel, then multiplied: as gpu/layers/norm.py's code then the product,
    and x + residual returned to the bit."""
    weight = q4_1_round_trip(_random(32, 64) * 0.05)
    packed = Int4DotGroups.pack(kernels, *int4_grid(weight))  # type: ignore[misc]
    assert packed is not None
    norm = RMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x, residual = (_random(3, 64, seed=seed).to(dtype) * 4 for seed in (5, 6))
    bias = _random(32, seed=7).to(dtype)
    expected_normed, expected_summed = norm.forward_with_residual(x, residual if has_residual else None)
    y, summed = packed.normed(x, residual if has_residual else None, norm, bias)
    assert torch.equal(summed, expected_summed)
    check_product(y, expected_normed, weight, bias, group_minimums(weight), normed_input=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemmas_norms_before_the_product_equal_the_norm_layers(kernels, dtype: torch.dtype) -> None:  # noqa: ANN001
    """Gemma 3's convention (scale 1 + w, in float32, rounded once), and its norm of the block's output before the
    residual add (a post norm): RMSNorm(post_norm(x) + residual) as gpu/layers/norm.py's code computes it, the sum
    returned to the bit."""
    weight = q8_0_round_trip(_random(32, 64) * 0.05)
    packed = Int8DotGroups.pack(kernels, *int8_grid(weight))  # type: ignore[misc]
    assert packed is not None
    norm, post_norm = (RMSNorm(64, 1e-6, convention=GEMMA3_NORM).to(dtype) for _ in range(2))
    with torch.no_grad():
        norm.weight.uniform_(-0.5, 1.0)
        post_norm.weight.uniform_(-0.5, 1.0)
    x, residual = (_random(3, 64, seed=seed).to(dtype) * 4 for seed in (5, 6))
    expected_normed, expected_summed = norm.forward_with_residual(post_norm(x), residual)
    out = torch.empty(3, 32, dtype=dtype)
    summed = torch.empty_like(x)
    kernels.linear_normed(packed.handle, x.data_ptr(), 64, residual.data_ptr(), 64, norm.weight.data_ptr(), 1e-6,
                          summed.data_ptr(), 3, None, out.data_ptr(), int(dtype == torch.bfloat16),
                          post_norm.weight.data_ptr(), 1.0, 1)
    assert torch.equal(summed, expected_summed)
    check_product(out, expected_normed, weight, normed_input=True)
    y, _ = packed.normed(x, residual, norm, None)  # without the post norm, through the layer's call
    check_product(y, norm.forward_with_residual(x, residual)[0], weight, normed_input=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", [SiluAndMul, GeluTanhAndMul], ids=["silu", "gelu_tanh"])
def test_an_activation_and_mul_before_the_product_equals_the_activation_layer(
        kernels, dtype: torch.dtype, activation: type[GatedActivation]) -> None:  # noqa: ANN001
    weight = q8_0_round_trip(_random(32, 64) * 0.05)
    packed = Int8DotGroups.pack(kernels, *int8_grid(weight))  # type: ignore[misc]
    assert packed is not None
    gate_up = (_random(2, 128, seed=8) * 3).to(dtype)
    act = activation()
    y = packed.gated(gate_up, None, act.activation)
    check_product(y, act(gate_up), weight, normed_input=True)
