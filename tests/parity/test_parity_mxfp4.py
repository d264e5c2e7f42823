"""gpt-oss with MXFP4 experts against transformers, float32 on CPU: a tiny gpt-oss checkpoint whose experts are
written in MXFP4 (tests/mxfp4_checkpoints.py); our engine serves it (experts dequantized exactly) and its greedy
tokens must equal transformers' on the same checkpoint, which transformers dequantizes by its own MXFP4 rule."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Mxfp4Config

from core import LLM, SamplingParams
from gpu.quant.mxfp4 import dequantize_mxfp4
from tests.moe_models import build_moe_model
from tests.mxfp4_checkpoints import quantize_rows, write_mxfp4_gpt_oss
from tests.parity.test_parity_cpu import prompts_of_lengths

PROMPTS = prompts_of_lengths((1, 7, 19, 40))


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(float gpt-oss, the same with MXFP4 experts)."""
    root = tmp_path_factory.mktemp("mxfp4")
    source = build_moe_model(root / "float", "gpt_oss", tiny_model_dirs["qwen3"])
    return source, write_mxfp4_gpt_oss(source, root / "mxfp4")


def transformers_dequantized(checkpoint: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=Mxfp4Config(dequantize=True),
                                                dtype=torch.float32).eval()


def test_greedy_tokens_equal_transformers_on_the_dequantized_checkpoint(checkpoints: tuple[Path, Path]) -> None:
    source, quantized = checkpoints
    hf = transformers_dequantized(quantized)
    llm = LLM(str(quantized), device="cpu", dtype="float32", kv_cache_blocks=64, max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert output.token_ids == expected[0, len(prompt):].tolist()
    # The quantization is real: the experts transformers dequantized differ from the float checkpoint's.
    original = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).model.layers[0].mlp.experts
    assert not torch.equal(original.down_proj, hf.model.layers[0].mlp.experts.down_proj)


def test_dequantization_equals_transformers_on_every_code_and_scale() -> None:
    """Every byte (both nibbles, each sign) under scales from 2^-20 to 2^3, against transformers' MXFP4 conversion
    of stacked experts ([experts, rows, blocks, 16] -> [experts, columns, rows])."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks = torch.arange(256, dtype=torch.uint8).view(2, 4, 2, 16)  # 2 experts, 4 rows, 2 blocks of 32
    scales = torch.tensor([107, 118, 127, 130], dtype=torch.uint8).repeat(2, 4, 1).view(2, 4, 2, 2)[..., 0]
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(dequantize_mxfp4(blocks, scales), expected.transpose(1, 2))


def test_written_blocks_round_trip_the_values_they_hold() -> None:
    """The tests' writer: values already on a block's grid come back exactly (its rounding is the nearest code)."""
    codes = torch.randint(0, 256, (3, 5, 2, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    scales = torch.randint(115, 130, (3, 5, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    values = dequantize_mxfp4(codes, scales)
    values[..., ::32] = 6 * torch.exp2(scales.float() - 127)  # each block's largest on its top code: X is the scale's
    values = values.masked_fill(values == 0, 0.0)  # -0.0 is written as +0.0
    assert torch.equal(dequantize_mxfp4(*quantize_rows(values)), values)


def test_intermediate_sizes_off_the_blocks_are_refused() -> None:
    """Each rank's share of the intermediate size must be whole blocks of 32 (the down projection's columns)."""
    from gpu.layers.moe import Experts, MoeSpec, Routing
    from gpu.quant.mxfp4 import Mxfp4ExpertsMethod

    spec = MoeSpec(Routing(8, 2, "top_k_softmax", has_bias=True), 48, "clamped_swiglu", has_expert_bias=True,
                   is_gpt_oss_layout=True)
    with pytest.raises(ValueError, match="whole blocks of 32"):
        Experts(64, spec).use_quant_method(Mxfp4ExpertsMethod())


def test_tensor_parallel_ranks_read_their_blocks(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """TP=2 on gloo: each rank reads its pairs of gate/up rows and its blocks of down's columns (an intermediate
    size of 64: 32, one block, a rank); tokens equal TP=1's and transformers'."""
    from tests.parity.test_tensor_parallel_cpu import make_llm

    source = build_moe_model(tmp_path / "float", "gpt_oss", tiny_model_dirs["qwen3"], intermediate_size=64)
    quantized = write_mxfp4_gpt_oss(source, tmp_path / "mxfp4")
    hf = transformers_dequantized(quantized)
    prompts = prompts_of_lengths((7, 12, 19))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    sharded = make_llm(quantized, 2)
    try:
        tokens = [o.token_ids for o in sharded.generate(prompts, params)]
    finally:
        sharded.engine.close()
    for prompt, output in zip(prompts, tokens, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert output == expected[0, len(prompt):].tolist()
