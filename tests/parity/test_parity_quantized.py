"""Quantized checkpoints against transformers, float32 on CPU: for each format a tiny checkpoint quantized by the
format's rule (tests/quant_checkpoints.py); our engine serves it (weights dequantized exactly, activations float32)
and its greedy tokens must equal transformers' on the same checkpoint dequantized by that rule. A GGUF with blocks
of every served type is served from its blocks and checked against transformers' own GGUF loader."""

from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM

from core import LLM, SamplingParams
from core.model_files.gguf_checkpoint import gguf_checkpoint
from core.tiny_model import TinyModelSpec, build_tiny_model
from tests import quant_checkpoints as qc
from tests.gguf_files import write_llama_gguf
from tests.parity.test_parity_cpu import hf_greedy, prompts_of_lengths

PROMPTS = prompts_of_lengths((1, 7, 19, 40))
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)

FORMATS = {  # name: (tiny model, quantizer, quantization_config)
    "fp8-blocks": ("qwen3", qc.fp8_blocks((32, 32)),
                   {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}),
    "fp8-tensor-static": ("llama", qc.fp8_per_tensor(0.05), {"quant_method": "fp8", "activation_scheme": "static"}),
    "gptq-int4-act-order": ("qwen3", qc.gptq(4, 32, act_order=True),
                            {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}),
    "gptq-int8": ("llama", qc.gptq(8, 32, act_order=False),
                  {"quant_method": "gptq", "bits": 8, "group_size": 32, "desc_act": False, "sym": False}),
    "awq": ("qwen2", qc.awq(32), {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm",
                                   "zero_point": True}),
}


def _ct_formats() -> dict[str, tuple[str, qc.Quantizer, dict[str, object]]]:
    return {"ct-fp8-channel": ("qwen2", *qc.ct_fp8_channel()),
            "ct-int4-symmetric": ("qwen3", *qc.ct_packed(4, 32, symmetric=True, act_order=False)),
            "ct-int4-zero-points-act-order": ("llama", *qc.ct_packed(4, 32, symmetric=False, act_order=True)),
            "ct-int8": ("qwen2", *qc.ct_packed(8, 32, symmetric=True, act_order=False))}


def llm(model_dir: Path) -> LLM:
    return LLM(str(model_dir), device="cpu", dtype="float32", kv_cache_blocks=64, max_num_seqs=8)


@pytest.mark.parametrize("name", [*FORMATS, "ct-fp8-channel", "ct-int4-symmetric", "ct-int4-zero-points-act-order",
                                  "ct-int8"])
def test_greedy_tokens_equal_transformers_on_the_dequantized_checkpoint(
        name: str, tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    if name.startswith("ct-"):
        pytest.importorskip("compressed_tensors")
    model, quantizer, config = FORMATS[name] if name in FORMATS else _ct_formats()[name]
    quantized, dequantized = qc.write_quantized(tiny_model_dirs[model], tmp_path, quantizer, config)
    ours = [o.token_ids for o in llm(quantized).generate(PROMPTS, GREEDY)]
    assert ours == [hf_greedy(dequantized, p, 10) for p in PROMPTS]
    # The quantization is real: the dequantized weights differ from the float model's, and so would its tokens.
    original = next(iter(AutoModelForCausalLM.from_pretrained(tiny_model_dirs[model]).model.layers[0].mlp
                         .down_proj.parameters()))
    rounded = next(iter(AutoModelForCausalLM.from_pretrained(dequantized).model.layers[0].mlp.down_proj.parameters()))
    assert not torch.equal(original, rounded)


GGUF_TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_K", "ffn_gate": "Q4_0",
              "ffn_up": "Q4_1", "ffn_down": "Q5_0", "token_embd": "Q8_0"}


GGUF_SPEC = TinyModelSpec(architecture="llama", hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                          intermediate_size=512, tie_word_embeddings=False, seed=3)


def tiny_gguf_of_every_type(directory: Path) -> Path:
    """A tiny Llama GGUF whose projections hold blocks of every served type (GGUF_TYPES), at random."""
    source = build_tiny_model(directory / "float", GGUF_SPEC)
    types = {kind: getattr(gguf.GGMLQuantizationType, name) for kind, name in GGUF_TYPES.items()}
    return write_llama_gguf(source, directory / "tiny.gguf", types, blocks=qc.random_gguf_blocks)


def test_gguf_blocks_of_every_type_equal_transformers_gguf_loader(tmp_path: Path) -> None:
    path = tiny_gguf_of_every_type(tmp_path)
    converted = gguf_checkpoint(path, tmp_path / "cache", "float32", keep_blocks=True)
    kept = {name.rsplit(".", 1)[0] for name in _tensor_names(converted) if name.endswith(".qweight")}
    assert len(kept) == 7 * GGUF_SPEC.num_layers  # every projection served from its blocks
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ours = llm(converted).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    for prompt, output in zip(PROMPTS, ours, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, min_new_tokens=10)
        assert output.token_ids == expected[0, len(prompt):].tolist()


def _tensor_names(checkpoint: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        return list(f.keys())


@pytest.fixture(scope="module")
def qwen3_moe_dir(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.moe_models import build_moe_model

    return build_moe_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", "qwen3_moe", tiny_model_dirs["qwen3"])


def test_fp8_block_experts_equal_transformers_on_the_dequantized_checkpoint(qwen3_moe_dir: Path,
                                                                            tmp_path: Path) -> None:
    """Qwen3-MoE with every linear layer and every expert in FP8 blocks (Qwen3-30B-A3B-FP8's form, smaller blocks)."""
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
    quantized, dequantized = qc.write_quantized(qwen3_moe_dir, tmp_path, qc.fp8_blocks((16, 16)), config)
    assert any(".experts.3.up_proj.weight_scale_inv" in name for name in _tensor_names(quantized))
    ours = [o.token_ids for o in llm(quantized).generate(PROMPTS, GREEDY)]
    assert ours == [hf_greedy(dequantized, p, 10) for p in PROMPTS]
    original = AutoModelForCausalLM.from_pretrained(qwen3_moe_dir).model.layers[0].mlp.experts.down_proj
    rounded = AutoModelForCausalLM.from_pretrained(dequantized).model.layers[0].mlp.experts.down_proj
    assert not torch.equal(original, rounded)


def test_fp8_block_experts_under_tensor_parallelism(qwen3_moe_dir: Path, tmp_path: Path) -> None:
    """TP=2 on gloo: each rank reads its rows of gate/up and its columns of down with their blocks' scales (16 of
    the experts' 32 intermediate rows a rank, one block); tokens equal transformers' on the dequantized checkpoint."""
    from tests.parity.test_tensor_parallel_cpu import make_llm

    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
    quantized, dequantized = qc.write_quantized(qwen3_moe_dir, tmp_path, qc.fp8_blocks((16, 16)), config)
    sharded = make_llm(quantized, 2)
    try:
        ours = [o.token_ids for o in sharded.generate(PROMPTS, GREEDY)]
    finally:
        sharded.engine.close()
    assert ours == [hf_greedy(dequantized, p, 10) for p in PROMPTS]


def test_experts_in_a_format_without_an_experts_method_are_refused_by_name(qwen3_moe_dir: Path,
                                                                           tmp_path: Path) -> None:
    """Experts the checkpoint quantizes in a format with no experts method (GPTQ here): an error that says so, not a
    load that fails on a tensor with no place (or reads packed levels as weights)."""
    config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": False}
    quantized, _ = qc.write_quantized(qwen3_moe_dir, tmp_path, qc.gptq(4, 32, act_order=False), config)
    with pytest.raises(ValueError, match="experts are quantized \\(gptq.*not supported yet"):
        llm(quantized)
