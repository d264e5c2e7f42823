"""The physical limit of a workload: the least time any engine could take on a given GPU.

An ideal schedule admits every request at once, prefills all prompts in one step and then decodes
every unfinished request in each later step. A step must at least move its bytes through device
memory, at the copy bandwidth measured on the same GPU, and do its FLOPs, at the measured matmul
rate; the step takes the larger of the two. Bytes counted per step: every weight once (the tied
embedding is read once, as the LM head; an untied input embedding only has a few rows gathered, so
it is not counted), every context token's K and V read once, and each new token's K and V written
once. Activations and logits are not counted, so the figure is a lower bound on time.

FLOPs per token: 2 per weight of the transformer layers' linear maps, 2 * hidden * vocab for the LM
head where a token is sampled, and 4 * heads * head_dim * layers per (query, context token) pair for
attention (QK^T and PV), with a causal prefill counting each query against its own prefix.
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path

from bench.workload import Request

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype_bytes: int = 2
    has_qk_norm: bool = True  # Qwen3 normalizes q and k per head

    @staticmethod
    def from_config(config: dict[str, object], dtype_bytes: int = 2) -> "ModelShape":
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])  # type: ignore[arg-type]
        return ModelShape(
            hidden_size=hidden, num_layers=int(config["num_hidden_layers"]), num_heads=heads,  # type: ignore[arg-type]
            num_kv_heads=int(config.get("num_key_value_heads", heads)),  # type: ignore[arg-type]
            head_dim=int(config.get("head_dim") or hidden // heads),  # type: ignore[arg-type]
            intermediate_size=int(config["intermediate_size"]),  # type: ignore[arg-type]
            vocab_size=int(config["vocab_size"]),  # type: ignore[arg-type]
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), dtype_bytes=dtype_bytes,
            has_qk_norm=config.get("model_type") == "qwen3",
        )

    @staticmethod
    def from_dir(model_dir: str | Path, dtype_bytes: int = 2) -> "ModelShape":
        return ModelShape.from_config(json.loads((Path(model_dir) / "config.json").read_text()), dtype_bytes)

    def per_rank(self, tensor_parallel_size: int) -> "ModelShape":
        """What one tensor-parallel rank holds and moves: its query heads, its KV heads (one at least: fewer KV
        heads than ranks are replicated), its share of the MLP and of the vocabulary; norms are whole on every
        rank. The ranks work in parallel, so a step's ideal time is one rank's (communication not counted)."""
        tp = tensor_parallel_size
        return replace(self, num_heads=self.num_heads // tp, num_kv_heads=max(1, self.num_kv_heads // tp),
                       intermediate_size=self.intermediate_size // tp, vocab_size=-(-self.vocab_size // tp))

    @property
    def layer_linear_params(self) -> int:
        """Weights of one layer's matmuls: q, k, v, o and the gated MLP (gate, up, down)."""
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_dim + 2 * kv_dim) + q_dim * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def layer_norm_params(self) -> int:
        return 2 * self.hidden_size + (2 * self.head_dim if self.has_qk_norm else 0)

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of the weights a step reads: the layers, the final norm and the LM head."""
        layers = self.num_layers * (self.layer_linear_params + self.layer_norm_params)
        return (layers + self.hidden_size + self.vocab_size * self.hidden_size) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def linear_flops_per_token(self) -> int:
        return 2 * self.num_layers * self.layer_linear_params

    @property
    def lm_head_flops_per_row(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    @property
    def attention_flops_per_pair(self) -> int:
        return 4 * self.num_heads * self.head_dim * self.num_layers


@dataclass(frozen=True)
class DeviceLimits:
    copy_bytes_per_s: float  # bytes read + written per second by a large device-to-device copy
    matmul_flops_per_s: float


@dataclass(frozen=True)
class StepCost:
    num_bytes: float
    num_flops: float

    def seconds(self, limits: DeviceLimits) -> float:
        return max(self.num_bytes / limits.copy_bytes_per_s, self.num_flops / limits.matmul_flops_per_s)


def prefill_cost(shape: ModelShape, prompt_lens: list[int]) -> StepCost:
    """One step that prefills every prompt and samples each one's first token."""
    num_tokens = sum(prompt_lens)
    num_bytes = shape.weight_bytes_per_step + 2 * num_tokens * shape.kv_bytes_per_token  # written, then read once
    pairs = sum(p * (p + 1) // 2 for p in prompt_lens)  # causal: query j attends to j + 1 tokens
    flops = (num_tokens * shape.linear_flops_per_token + len(prompt_lens) * shape.lm_head_flops_per_row
             + pairs * shape.attention_flops_per_pair)
    return StepCost(num_bytes, flops)


def decode_cost(shape: ModelShape, context_lens: list[int]) -> StepCost:
    """One decode step: each row feeds one token whose context (itself included) has the given length."""
    num_rows = len(context_lens)
    num_bytes = (shape.weight_bytes_per_step + sum(context_lens) * shape.kv_bytes_per_token
                 + num_rows * shape.kv_bytes_per_token)
    flops = (num_rows * (shape.linear_flops_per_token + shape.lm_head_flops_per_row)
             + sum(context_lens) * shape.attention_flops_per_pair)
    return StepCost(num_bytes, flops)


@dataclass(frozen=True)
class IdealRun:
    seconds: float
    num_output_tokens: int
    num_steps: int
    num_bytes: float
    num_flops: float
    kv_share: float  # share of all bytes that are K/V reads and writes

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def ideal_run(shape: ModelShape, requests: list[Request], limits: DeviceLimits) -> IdealRun:
    """The ideal schedule: one prefill step for all prompts, then one decode step per further token."""
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    steps = [prefill_cost(shape, prompt_lens)]
    for t in range(2, max(r.max_tokens for r in requests) + 1):
        # The step that makes output token t feeds output token t - 1: its context is P + t - 1 tokens.
        steps.append(decode_cost(shape, [p + t - 1 for p, r in zip(prompt_lens, requests, strict=True)
                                         if r.max_tokens >= t]))
    num_bytes = sum(s.num_bytes for s in steps)
    weight_bytes = len(steps) * shape.weight_bytes_per_step
    return IdealRun(
        seconds=sum(s.seconds(limits) for s in steps), num_output_tokens=sum(r.max_tokens for r in requests),
        num_steps=len(steps), num_bytes=num_bytes, num_flops=sum(s.num_flops for s in steps),
        kv_share=(num_bytes - weight_bytes) / num_bytes,
    )


def ideal_decode_step_seconds(shape: ModelShape, context_len: int, limits: DeviceLimits) -> float:
    """Least time of one batch-1 decode step at the given context length."""
    return decode_cost(shape, [context_len]).seconds(limits)
