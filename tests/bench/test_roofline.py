"""The ideal-time arithmetic, on a tiny model and workload worked out by hand, and on Qwen3-0.6B's size."""

import math

import pytest
import torch

from bench.bench_model import QWEN3_0P6B
from bench.roofline import DeviceLimits, ModelShape, decode_cost, ideal_decode_step_seconds, ideal_run, prefill_cost
from bench.workload import Request

# hidden 8, 2 layers, 2 query heads and 1 KV head of dim 4, MLP 16, vocab 32, tied, bf16.
TINY = ModelShape(hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4, intermediate_size=16,
                  vocab_size=32, tie_word_embeddings=True, dtype_bytes=2, has_qk_norm=True)


def test_tiny_shape_by_hand() -> None:
    # q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; gate, up, down 3 x 8x16 = 384.
    assert TINY.layer_linear_params == 576
    # Two RMSNorms of 8 and q/k norms of 4 per layer = 24; + final norm 8 + tied LM head 32x8 = 256.
    assert TINY.weight_bytes_per_step == (2 * (576 + 24) + 8 + 256) * 2 == 2928
    assert TINY.kv_bytes_per_token == 2 * 2 * 1 * 4 * 2 == 32  # K and V, 2 layers, 1 head of 4, 2 bytes
    assert TINY.linear_flops_per_token == 2 * 2 * 576
    assert TINY.lm_head_flops_per_row == 2 * 8 * 32
    assert TINY.attention_flops_per_pair == 4 * 2 * 4 * 2


def test_step_costs_by_hand() -> None:
    # Prefill of prompts of 3 and 2 tokens: KV of 5 tokens written and read; 6 + 3 causal pairs; 2 LM-head rows.
    prefill = prefill_cost(TINY, [3, 2])
    assert prefill.num_bytes == 2928 + 2 * 5 * 32 == 3248
    assert prefill.num_flops == 5 * 2304 + 2 * 512 + 9 * 64 == 13120
    # One row decoding at context 4: reads 4 tokens' KV, writes 1.
    decode = decode_cost(TINY, [4])
    assert decode.num_bytes == 2928 + 4 * 32 + 32 == 3088
    assert decode.num_flops == 2304 + 512 + 4 * 64 == 3072


def test_ideal_run_by_hand_memory_bound() -> None:
    # Request A: 3-token prompt, 2 output tokens; B: 2-token prompt, 1 output token. Steps: the prefill
    # (both first tokens), then one decode step for A's second token at context 3 + 1.
    requests = [Request([1, 2, 3], 2), Request([4, 5], 1)]
    run = ideal_run(TINY, requests, DeviceLimits(copy_bytes_per_s=1000.0, matmul_flops_per_s=10_000.0))
    assert run.num_steps == 2
    assert run.seconds == pytest.approx(3.248 + 3.088)  # bytes decide both steps
    assert run.num_output_tokens == 3
    assert run.tokens_per_s == pytest.approx(3 / 6.336)
    assert run.kv_share == pytest.approx((6336 - 2 * 2928) / 6336)


def test_ideal_run_by_hand_compute_bound() -> None:
    requests = [Request([1, 2, 3], 2), Request([4, 5], 1)]
    run = ideal_run(TINY, requests, DeviceLimits(copy_bytes_per_s=1e6, matmul_flops_per_s=1000.0))
    assert run.seconds == pytest.approx(13.12 + 3.072)  # FLOPs decide both steps


def test_decode_contexts_grow_one_token_per_step() -> None:
    # One request, prompt 10, 4 tokens: decode steps at contexts 11, 12, 13.
    run = ideal_run(TINY, [Request(list(range(10)), 4)], DeviceLimits(1.0, 1e30))
    expected = prefill_cost(TINY, [10]).num_bytes + sum(decode_cost(TINY, [c]).num_bytes for c in (11, 12, 13))
    assert run.num_steps == 4 and run.seconds == pytest.approx(expected)


def test_qwen3_0p6b_weight_bytes_equal_the_real_models_parameters() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_0P6B))
    num_params = sum(p.numel() for p in model.parameters())  # tied: the embedding is counted once
    shape = ModelShape.from_config({**QWEN3_0P6B, "model_type": "qwen3"})
    assert shape.weight_bytes_per_step == 2 * num_params
    assert shape.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2


def test_batch1_ideal_at_1k_context_on_an_h100() -> None:
    # DESIGN.md's figure: 0.44 ms at 3.02 TB/s (1.19 GB of weights + 1k tokens of K/V).
    shape = ModelShape.from_config({**QWEN3_0P6B, "model_type": "qwen3"})
    ms = ideal_decode_step_seconds(shape, 1024, DeviceLimits(3.02e12, 800e12)) * 1e3
    assert math.isclose(ms, (1_192_099_840 + 1025 * 114_688) / 3.02e12 * 1e3)
    assert 0.43 < ms < 0.44


def test_one_tensor_parallel_rank_by_hand() -> None:
    # Of 2 ranks: 1 query head, the one KV head replicated, MLP 8, vocab 16; norms whole.
    rank = TINY.per_rank(2)
    # q 8x4 + k 8x4 + v 8x4 + o 4x8 = 128; gate, up, down 3 x 8x8 = 192.
    assert rank.layer_linear_params == 320
    assert rank.weight_bytes_per_step == (2 * (320 + 24) + 8 + 16 * 8) * 2 == 1648
    assert rank.kv_bytes_per_token == TINY.kv_bytes_per_token  # the replicated head is stored on both ranks
    whole = ModelShape.from_config(QWEN3_0P6B)
    assert whole.per_rank(2).num_kv_heads == 4 and whole.per_rank(2).kv_bytes_per_token * 2 == whole.kv_bytes_per_token
