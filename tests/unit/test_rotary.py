"""Rotary embedding: our three-operation rotation (a roll by half against a sign-folded sine) gives transformers'
rotate-half products to the bit, for query and key heads rotated apart or together."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from gpu.layers.rotary import RotaryEmbedding

HEAD_DIM = 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rotation_equals_transformers_to_the_bit(dtype: torch.dtype) -> None:
    rotary = RotaryEmbedding(LlamaConfig(head_dim=HEAD_DIM, rope_theta=100000.0), HEAD_DIM, 512).to(dtype)
    generator = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 300, 511])
    q = (torch.randn(5, 9, HEAD_DIM, generator=generator) * 4).to(dtype)
    k = (torch.randn(5, 3, HEAD_DIM, generator=generator) * 4).to(dtype)
    cos, sin = rotary.cos[positions].to(dtype), rotary.sin[positions].to(dtype)
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    got_q, got_k = rotary(positions, q, k)
    assert torch.equal(got_q, expected_q) and torch.equal(got_k, expected_k)
    together = rotary.rotate(positions, torch.cat([q, k], dim=1))  # as the attention layer rotates them on a CPU
    assert torch.equal(together, torch.cat([expected_q, expected_k], dim=1))
