"""Linear weights packed for the CPU (gpu/layers/cpu_linear.py, gpu/cpu_packing.py): which form a weight takes,
what torch's int4 forms' products equal (the int8 dot-product forms: tests/unit/test_int8_dot_linear.py), and
runners on a checkpoint whose weights came out of a Q4_1 GGUF."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file

from core import LLMEngine, SamplingParams
from core.config import engine_config
from core.engine import runner_config
from gpu.config import KernelConfig
from gpu.cpu_kernels import load_cpu_kernels
from gpu.cpu_packing import first_layer_on_a_grid, has_native_bfloat16
from gpu.layers.cpu_linear import (
    GROUP_SIZE,
    CpuPacking,
    Int4Groups,
    Int8Groups,
    OneDnnWeight,
    int4_grid,
    int8_grid,
    onednn_lays_out_bfloat16,
)
from gpu.layers.int8_dot_linear import Int4DotGroups, Int8DotGroups
from gpu.layers.linear import Linear
from gpu.model_runner import ModelRunner
from tests.greedy_agreement import EngineOutput, assert_diverge_rarely_near_ties, generate

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="packing needs torch with oneDNN")


def round_trip(weight: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    """The weight as a GGUF of that type holds it, dequantized by the gguf package (as our GGUF conversion does)."""
    return torch.from_numpy(np.ascontiguousarray(dequantize(quantize(weight.float().numpy(), kind), kind)))


def q4_1_round_trip(weight: torch.Tensor) -> torch.Tensor:
    return round_trip(weight, GGMLQuantizationType.Q4_1)


def q8_0_round_trip(weight: torch.Tensor) -> torch.Tensor:
    return round_trip(weight, GGMLQuantizationType.Q8_0)


def q5_0_round_trip(weight: torch.Tensor) -> torch.Tensor:
    return round_trip(weight, GGMLQuantizationType.Q5_0)


def q4_k_like(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """A weight as a Q4_K block dequantizes (the gguf package cannot write one): per 256 columns a float16 scale and
    minimum, per 32 a 6-bit multiple of each; w = d * sc * q - dmin * m with q 2..13, so no group spans all 16
    levels."""
    g = torch.Generator().manual_seed(seed)
    blocks = (out_features, in_features // 256)
    d, dmin = ((torch.rand(*blocks, generator=g) * 0.01 + 1e-3).half().float() for _ in range(2))
    sub = (out_features, in_features // GROUP_SIZE)
    sc, m = torch.randint(1, 64, sub, generator=g).float(), torch.randint(0, 64, sub, generator=g).float()
    scales, minimums = d.repeat_interleave(8, -1) * sc, -dmin.repeat_interleave(8, -1) * m
    q = torch.randint(2, 14, (*sub, GROUP_SIZE), generator=g).float()
    return (q * scales.unsqueeze(-1) + minimums.unsqueeze(-1)).view(out_features, in_features)


def q6_k_like(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, steps) as a Q6_K block dequantizes (the gguf package cannot write one): per 256 columns a float16 d, per
    16 a signed 8-bit scale; w = d * scale * (q - 32) with q 0..63, in float32 as the gguf package computes it, and
    steps [out, in / 16] = d * scale."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(out_features, in_features // 256, generator=g) * 1e-3 + 1e-4).half().float()
    scales = torch.randint(-128, 128, (out_features, in_features // 16), generator=g).float()
    scales[scales == 0] = 1
    steps = d.repeat_interleave(16, -1) * scales
    q = torch.randint(0, 64, (out_features, in_features // 16, 16), generator=g).float()
    return (steps.unsqueeze(-1) * (q - 32)).view(out_features, in_features), steps


TORCH_INT4 = CpuPacking(torch.bfloat16, None)  # where the int8 dot-product kernels could not be built


def _random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _bfloat16_rounded_groups(packed: Int4Groups, out_features: int, in_features: int) -> torch.Tensor:
    """The weight the kernel multiplies by: (level - 8) * scale + zero with its bfloat16 scale and zero."""
    identity = torch.eye(in_features, dtype=torch.bfloat16)
    return packed(identity, None).float().T  # [out, in]; exact: each column is one weight


def test_a_q4_1_weight_is_kept_as_its_4_bit_groups() -> None:
    weight = q4_1_round_trip(_random(96, 128) * 0.05)
    packed = TORCH_INT4.pack(weight)
    assert isinstance(packed, Int4Groups)
    kept = _bfloat16_rounded_groups(packed, 96, 128)
    # The same weights up to the bfloat16 rounding of each group's scale and zero point (2^-8 relative to them).
    step = (weight.view(96, 4, GROUP_SIZE).amax(-1) - weight.view(96, 4, GROUP_SIZE).amin(-1)) / 15
    zero_scale = weight.view(96, 4, GROUP_SIZE).abs().amax(-1) + 8 * step
    bound = (8 * step + zero_scale) * 2**-8
    assert ((kept - weight).abs().view(96, 4, GROUP_SIZE) <= bound.unsqueeze(-1)).all()
    x = _random(3, 128, seed=1).bfloat16()
    torch.testing.assert_close(packed(x, None).float(), x.float() @ kept.T, rtol=2**-7, atol=1e-2)


def test_a_q8_0_weight_is_kept_as_two_4_bit_planes() -> None:
    weight = q8_0_round_trip(_random(96, 128) * 0.05)
    packed = TORCH_INT4.pack(weight)
    assert isinstance(packed, Int8Groups)
    kept = _bfloat16_rounded_groups(packed, 96, 128)
    # The same weights up to the bfloat16 rounding of each group's scale (2^-8 of the largest magnitude); each
    # plane's output is rounded to bfloat16 before the float32 sum, hence the bound's factor 2.
    largest = weight.view(96, 4, GROUP_SIZE).abs().amax(-1, keepdim=True)
    assert ((kept - weight).abs().view(96, 4, GROUP_SIZE) <= 2 * largest * 2**-8).all()
    x = _random(3, 128, seed=1).bfloat16()
    torch.testing.assert_close(packed(x, None).float(), x.float() @ weight.T, rtol=2**-6, atol=2e-2)


def test_a_q5_0_weight_lies_on_8_bit_groups_of_its_own_float16_scale() -> None:
    """Q5_0's levels (-16..15) need not reach 127: the step is found as each group's smallest, and it is the file's
    float16 scale (its magnitude). One value off the grid and the weight is off every grid; a step that is no float16
    is taken per half group only."""
    weight = _random(64, 128) * 0.05
    blocks = quantize(weight.numpy(), GGMLQuantizationType.Q5_0)  # [out, groups * 22]: float16 scale, 5-bit levels
    file_scales = torch.from_numpy(blocks.reshape(64, 4, 22)[..., :2].copy().view(np.float16)).float().view(64, 4)
    dequantized = q5_0_round_trip(weight)
    found = int8_grid(dequantized)
    assert found is not None
    levels, scales = found
    # The quantizer's scale carries a sign (its largest magnitude is level -16): ours is its magnitude.
    assert torch.equal(scales, file_scales.abs()) and levels.abs().max() <= 16
    assert torch.equal((levels.view(64, 4, GROUP_SIZE) * scales.unsqueeze(-1)).view(64, 128), dequantized)
    off = dequantized.clone()
    off[3, 9] += 0.3 * file_scales[3, 0]
    assert int8_grid(off) is None
    # 0.1 is no float16: not a whole group's float16 scale, only half groups' own float32 steps (Q6_K's form)
    assert int8_grid(torch.randint(-16, 16, (64, 128)).float() * 0.1)[1].shape == (64, 8)  # type: ignore[index]
    unstepped = torch.zeros(16, 32)
    unstepped[0, :3] = torch.tensor([10.0, 19.0, -10.0])  # no step among a ninth of the smallest gap down: refused
    assert int8_grid(unstepped) is None


def test_a_q4_k_weight_lies_on_4_bit_groups_of_its_own_steps() -> None:
    """Q4_K's groups of 32 need not reach level 0 or 15: the step is found as each group's smallest, from its minimum;
    the scales (a 6-bit integer times a float16) are mostly no float16, and kept as found."""
    weight = q4_k_like(32, 512)
    found = int4_grid(weight)
    assert found is not None
    levels, scales, minimums = found
    assert levels.min() >= 0 and levels.max() <= 15
    rebuilt = levels.view(32, 16, GROUP_SIZE) * scales.unsqueeze(-1) + minimums.unsqueeze(-1)
    torch.testing.assert_close(rebuilt.view(32, 512), weight, rtol=1e-6, atol=1e-7)
    assert (scales.half().float() != scales).float().mean() > 0.5
    off = weight.clone()
    off[2, 40] += 0.3 * scales[2, 1]
    assert int4_grid(off) is None


def test_a_q6_k_weight_lies_on_8_bit_halves_of_its_own_steps() -> None:
    """Q6_K's sub-blocks of 16 columns each have their own step (a float16 times an 8-bit integer): found per half
    group, exactly the file's, its levels -32..32; one value off and the weight is off every grid. Torch's int4 kernel
    takes no half groups."""
    weight, steps = q6_k_like(32, 512)
    found = int8_grid(weight)
    assert found is not None
    levels, scales = found
    assert scales.shape == (32, 32) and torch.equal(scales, steps.abs())
    assert levels.abs().max() <= 32
    torch.testing.assert_close((levels.view(32, 32, 16) * scales.unsqueeze(-1)).view(32, 512), weight, rtol=1e-6,
                               atol=0)
    off = weight.clone()
    off[2, 40] += 0.3 * steps[2, 2]
    assert int8_grid(off) is None
    assert TORCH_INT4.pack_int8_groups(levels, scales) is None


@pytest.mark.parametrize("case", ["random", "one value off the grid", "16 rows short", "columns not in groups"])
def test_weights_off_the_grid_or_of_other_shapes_are_bfloat16(case: str) -> None:
    weight = {"random": _random(96, 128), "16 rows short": q4_1_round_trip(_random(88, 128)),
              "columns not in groups": q4_1_round_trip(_random(96, 160))[:, :144].contiguous(),
              "one value off the grid": q4_1_round_trip(_random(96, 128))}[case]
    if case == "one value off the grid":
        weight[5, 7] += 0.01 * (weight[5, :32].amax() - weight[5, :32].amin()) / 15
    packed = TORCH_INT4.pack(weight)
    if not onednn_lays_out_bfloat16():  # this CPU: oneDNN has no bfloat16 layout, so the weight stays as loaded
        assert packed is None
        return
    assert isinstance(packed, OneDnnWeight)
    x = _random(5, weight.shape[1], seed=2).bfloat16()
    bias = _random(weight.shape[0], seed=3).bfloat16()
    assert torch.equal(packed(x, bias), F.linear(x, weight.bfloat16(), bias))  # F.linear's bits


def test_linear_packs_in_place_frees_its_weight_and_adds_its_bias() -> None:
    layer = Linear(128, 96, bias=True)
    with torch.no_grad():
        layer.weight.copy_(q4_1_round_trip(_random(96, 128) * 0.05))
        layer.bias.copy_(_random(96, seed=4))
    x = _random(2, 128, seed=5).bfloat16()
    expected = F.linear(x.float(), layer.weight, layer.bias.bfloat16().float())
    assert layer.pack_for_cpu(TORCH_INT4) == Int4Groups.kind  # from float32 values, as the runner packs them
    layer.to(torch.bfloat16)
    assert layer.weight is None and isinstance(layer.packed, Int4Groups)
    torch.testing.assert_close(layer(x).float(), expected, rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def q4_1_llama_dir(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with its projections as a Q4_1 GGUF gives them back and its LM head as a Q8_0 one does."""
    source, target = tiny_model_dirs["llama"], tmp_path_factory.mktemp("q4_1-llama")
    for path in source.iterdir():
        if path.suffix != ".safetensors":
            (target / path.name).write_bytes(path.read_bytes())
    tensors = load_file(source / "model.safetensors")
    converted = {name: q4_1_round_trip(t) if name.endswith("_proj.weight") else t for name, t in tensors.items()}
    converted["lm_head.weight"] = q8_0_round_trip(tensors["lm_head.weight"])  # as the default model's (Q8_0)
    save_file(converted, target / "model.safetensors", metadata={"format": "pt"})
    assert json.loads((target / "config.json").read_text())["hidden_size"] % GROUP_SIZE == 0
    return target


def has_int8_dot_kernels() -> bool:
    return load_cpu_kernels(None).int8_dot is not None


def expected_forms(requested: str, dtype: torch.dtype) -> tuple[type | None, type | None]:
    """The packed forms of (a Q4_1 projection, a Q8_0 LM head) on this machine for `--dtype requested` (serving
    `dtype`), None: as loaded. Float32 asked for by name is the reference, packed by nothing."""
    if requested == "float32":
        return None, None
    if has_int8_dot_kernels():
        return Int4DotGroups, Int8DotGroups
    return (Int4Groups, Int8Groups) if dtype == torch.bfloat16 else (None, None)


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16"])
def test_a_runner_keeps_a_ggufs_groups(q4_1_llama_dir: Path, dtype: str) -> None:
    config = runner_config(engine_config(str(q4_1_llama_dir), device="cpu", dtype=dtype, kv_cache_blocks=16))
    runner = ModelRunner(config)
    model = runner.model
    projection, head = expected_forms(dtype, runner.dtype)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if projection is None:
        assert linears and all(m.packed is None and m.weight is not None for m in linears)
    else:
        assert linears and all(isinstance(m.packed, projection) and m.weight is None for m in linears)
        assert isinstance(model.lm_head.packed, head) and model.lm_head.weight is not None  # kept (ties)
    unpacked = ModelRunner(replace(config, kernels=KernelConfig(cpu_packed_weights=False))).model
    assert all(m.packed is None for m in unpacked.modules() if isinstance(m, Linear))


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_packed_and_unpacked_give_the_same_greedy_tokens_but_at_near_ties(q4_1_llama_dir: Path, dtype: str) -> None:
    """Packed products round differently from F.linear's (the int8 dot products quantize the activations; torch's
    int4 kernel rounds scales to bfloat16): greedy tokens agree but at rare near-ties."""
    prompts = [[5, 17, 99, 3], list(range(40, 75)), [7], [11, 12] * 9]
    config = engine_config(str(q4_1_llama_dir), device="cpu", dtype=dtype, kv_cache_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5)

    def run(packed: bool) -> list[EngineOutput]:
        runner = ModelRunner(replace(runner_config(config), kernels=KernelConfig(cpu_packed_weights=packed)))
        return generate(LLMEngine(config, runner), prompts, params)

    assert_diverge_rarely_near_ties(run(packed=True), run(packed=False))


def test_auto_dtype_on_a_cpu(tiny_model_dirs: dict[str, Path], q4_1_llama_dir: Path, tmp_path: Path,
                             caplog: pytest.LogCaptureFixture) -> None:
    """Float32 for a float32 checkpoint on a GGUF grid where the int8 dot-product kernels run; else bfloat16 where the
    CPU has the instructions (a float32 checkpoint off every grid too: only bfloat16 would halve its bytes). The log
    says which and why."""
    caplog.set_level("INFO")
    bfloat16_dir = tmp_path / "bfloat16"
    shutil.copytree(tiny_model_dirs["llama"], bfloat16_dir)
    config_file = bfloat16_dir / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"dtype": "bfloat16"}))
    native = torch.bfloat16 if has_native_bfloat16() else torch.float32
    off_grid = tiny_model_dirs["llama"]
    assert json.loads((off_grid / "config.json").read_text())["dtype"] == "float32"
    for directory, expected in [(q4_1_llama_dir, torch.float32 if has_int8_dot_kernels() else native),
                                (off_grid, native), (bfloat16_dir, native)]:
        config = runner_config(engine_config(str(directory), device="cpu", kv_cache_blocks=8))
        assert ModelRunner(config).dtype == expected
        assert f"dtype auto: {str(expected).removeprefix('torch.')} (" in caplog.text
        caplog.clear()


def test_the_first_layers_projections_decide_whether_a_checkpoint_is_on_a_grid(
        tiny_model_dirs: dict[str, Path], q4_1_llama_dir: Path, tmp_path: Path) -> None:
    assert first_layer_on_a_grid(q4_1_llama_dir)
    assert not first_layer_on_a_grid(tiny_model_dirs["llama"])
    assert not first_layer_on_a_grid(tmp_path)  # no weight files
    tensors = load_file(q4_1_llama_dir / "model.safetensors")
    name = next(n for n in tensors if ".layers.0." in n and n.endswith("down_proj.weight"))
    tensors[name] = tensors[name] + 1e-3 * torch.randn(tensors[name].shape)  # one projection off its grid
    (tmp_path / "off").mkdir()
    save_file(tensors, tmp_path / "off" / "model.safetensors", metadata={"format": "pt"})
    assert not first_layer_on_a_grid(tmp_path / "off")
