"""Qwen3: the Llama decoder with an RMSNorm on each head's query and key before RoPE."""

from gpu.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    has_qk_norm = True
