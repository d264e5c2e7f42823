"""The ideal-time arithmetic: shapes read from checkpoints (dense, untied, packed, mixture of experts, sliding
window) and a tiny workload worked out by hand."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from bench.bench_model import SHAPES, build_random_checkpoint
from bench.roofline import DeviceLimits, ModelShape, decode_cost, ideal_run, prefill_cost
from bench.workload import Request

# hidden 8, 2 layers, 2 query heads and 1 KV head of dim 4, MLP 16, vocab 32, tied, bf16.
CONFIG = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
          "vocab_size": 32}


def checkpoint(directory: Path, tensors: dict[str, torch.Tensor], **config: object) -> Path:
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**CONFIG, **config}))
    return directory


def layer(i: int, mlp: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    shapes = {"q_proj": (8, 8), "k_proj": (4, 8), "v_proj": (4, 8), "o_proj": (8, 8), "input_layernorm": (8,)} | mlp
    return {f"model.layers.{i}.{name}.weight": torch.zeros(shape) for name, shape in shapes.items()}


DENSE_MLP = {"gate_proj": (16, 8), "up_proj": (16, 8), "down_proj": (8, 16)}
TINY = ModelShape(hidden_size=8, vocab_size=32, num_heads=2, num_kv_heads=1, head_dim=4, num_full_layers=2,
                  dense_bytes=2 * (2 * (576 + 8) + 8 + 256), linear_params_per_token=2 * 576)


def test_a_dense_tied_checkpoint_by_hand(tmp_path: Path) -> None:
    tensors = {"model.embed_tokens.weight": torch.zeros(32, 8), "model.norm.weight": torch.zeros(8),
               **layer(0, DENSE_MLP), **layer(1, DENSE_MLP)}
    shape = ModelShape.from_dir(checkpoint(tmp_path / "m", tensors), dtype_bytes=2)
    # Per layer q 64 + k 32 + v 32 + o 64 + MLP 384 = 576 weights, a norm of 8; the final norm; the tied embedding
    # read once as the LM head; float32 tensors counted at the serving dtype's 2 bytes.
    assert shape == TINY
    assert shape.kv_bytes_per_new_token == 2 * 2 * 1 * 4 * 2  # K and V, 2 layers, 1 head of 4, 2 bytes
    assert replace(shape, kv_dtype_bytes=1).kv_bytes_per_new_token == 2 * 2 * 1 * 4  # an FP8 cache: a byte each
    assert shape.lm_head_flops_per_row == 2 * 8 * 32 and shape.attention_flops_per_pair == 4 * 2 * 4 * 2


def test_an_untied_embedding_is_gathered_not_read_and_packed_weights_count_as_stored(tmp_path: Path) -> None:
    packed = {**layer(0, {"gate_proj": (16, 8), "up_proj": (16, 8), "down_proj": (8, 16)}),
              "model.layers.0.mlp.down_proj.qweight": torch.zeros(8, 2, dtype=torch.int32)}
    tensors = {"model.embed_tokens.weight": torch.zeros(32, 8), "lm_head.weight": torch.zeros(32, 8), **packed}
    shape = ModelShape.from_dir(checkpoint(tmp_path / "m", tensors, num_hidden_layers=1), dtype_bytes=4)
    assert shape.dense_bytes == 4 * (576 + 8 + 256) + 64  # 16 int32s as stored, the embedding left out
    assert shape.linear_params_per_token == 576 + 2 * 64  # a packed tensor holds 4-bit weights


def test_fp8_weights_count_one_byte_each(tmp_path: Path) -> None:
    tensors = {"model.embed_tokens.weight": torch.zeros(32, 8), **layer(0, DENSE_MLP)}
    tensors["model.layers.0.down_proj.weight"] = torch.zeros(8, 16, dtype=torch.float8_e4m3fn)
    shape = ModelShape.from_dir(checkpoint(tmp_path / "m", tensors, num_hidden_layers=1), dtype_bytes=2)
    assert shape.dense_bytes == 2 * (576 - 128 + 8 + 256) + 128  # the FP8 projection's 128 weights at one byte
    assert shape.linear_params_per_token == 576


def test_mixture_of_experts_reads_the_experts_its_rows_reach(tmp_path: Path) -> None:
    experts = {f"mlp.experts.{e}.{name}": shape for e in range(4) for name, shape in DENSE_MLP.items()}
    tensors = {"model.embed_tokens.weight": torch.zeros(32, 8), **layer(0, {"mlp.gate": (4, 8)} | experts)}
    shape = ModelShape.from_dir(checkpoint(tmp_path / "m", tensors, num_hidden_layers=1, num_experts=4,
                                           num_experts_per_tok=2), dtype_bytes=2)
    assert shape.expert_bytes == 4 * 384 * 2 and shape.dense_bytes == 2 * (192 + 32 + 8 + 256)
    assert shape.linear_params_per_token == 192 + 32 + 2 * 384  # attention, the router, 2 of the 4 experts
    assert shape.experts_reached(1) == 0.5 and shape.experts_reached(2) == 0.75  # 1 - (1 - 2/4)^rows
    assert shape.weight_bytes(1) == shape.dense_bytes + 2 * 384 * 2


def test_sliding_window_layers_read_their_window_only(tmp_path: Path) -> None:
    tensors = {"model.embed_tokens.weight": torch.zeros(32, 8), **layer(0, DENSE_MLP), **layer(1, DENSE_MLP)}
    shape = ModelShape.from_dir(checkpoint(tmp_path / "m", tensors, sliding_window=100,
                                           layer_types=["sliding_attention", "full_attention"]))
    per_layer = shape.kv_bytes_per_token_and_layer
    assert shape.kv_bytes([50, 300]) == (50 + 300) * per_layer + (50 + 100) * per_layer


def test_a_random_checkpoint_of_any_family_reads_as_its_parameters(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    moe = dict(model_type="qwen3_moe", vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8,
               num_experts_per_tok=2, tie_word_embeddings=True)
    for name, config in (("tiny", SHAPES["tiny"]), ("moe", moe)):
        directory = build_random_checkpoint(tmp_path / name, config, torch.float32)
        model = AutoModelForCausalLM.from_pretrained(directory)
        params = {n: p.numel() for n, p in model.named_parameters()}  # tied: the embedding counted once
        shape = ModelShape.from_dir(directory, dtype_bytes=2)
        expert = sum(n for name, n in params.items() if ".experts." in name)
        assert (shape.dense_bytes, shape.expert_bytes) == (2 * (sum(params.values()) - expert), 2 * expert), name


def test_step_costs_by_hand() -> None:
    # Prefill of prompts of 3 and 2 tokens: KV of 5 tokens written and read; 6 + 3 causal pairs; 2 LM-head rows.
    prefill = prefill_cost(TINY, [3, 2])
    assert prefill.num_bytes == 2864 + 2 * 5 * 32 == 3184
    assert prefill.num_flops == 5 * 2304 + 2 * 512 + 9 * 64 == 13120
    # One row decoding at context 4: reads 4 tokens' KV, writes 1.
    decode = decode_cost(TINY, [4])
    assert decode.num_bytes == 2864 + 4 * 32 + 32 == 3024
    assert decode.num_flops == 2304 + 512 + 4 * 64 == 3072


def test_ideal_run_by_hand() -> None:
    # A: 3-token prompt, 2 output tokens; B: 2-token prompt, 1 token. The prefill makes both first tokens, then one
    # decode step A's second at context 3 + 1. Bytes decide both steps here, FLOPs on a device fast at copying.
    requests = [Request([1, 2, 3], 2), Request([4, 5], 1)]
    run = ideal_run(TINY, requests, DeviceLimits(copy_bytes_per_s=1000.0, matmul_flops_per_s=10_000.0))
    assert (run.num_steps, run.num_output_tokens) == (2, 3)
    assert run.seconds == pytest.approx(3.184 + 3.024) and run.tokens_per_s == pytest.approx(3 / 6.208)
    run = ideal_run(TINY, requests, DeviceLimits(copy_bytes_per_s=1e6, matmul_flops_per_s=1000.0))
    assert run.seconds == pytest.approx(13.12 + 3.072)


def test_decode_contexts_grow_one_token_per_step() -> None:
    # One request, prompt 10, 4 tokens: decode steps at contexts 11, 12, 13.
    run = ideal_run(TINY, [Request(list(range(10)), 4)], DeviceLimits(1.0, 1e30))
    expected = prefill_cost(TINY, [10]).num_bytes + sum(decode_cost(TINY, [c]).num_bytes for c in (11, 12, 13))
    assert run.num_steps == 4 and run.seconds == pytest.approx(expected)
    assert decode_cost(TINY, [11]).seconds(DeviceLimits(1.0, 1e30)) == decode_cost(TINY, [11]).num_bytes


def test_one_tensor_parallel_rank() -> None:
    rank = TINY.per_rank(2)  # 1 query head, the one KV head replicated; the weights halved
    assert (rank.num_heads, rank.num_kv_heads, rank.dense_bytes) == (1, 1, TINY.dense_bytes // 2)
    assert rank.kv_bytes_per_new_token == TINY.kv_bytes_per_new_token
    assert math.isclose(rank.linear_params_per_token, TINY.linear_params_per_token / 2)
