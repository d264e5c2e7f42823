"""The ideal of a workload: the least time any engine could take on this device, and the device limits it uses.

An ideal schedule admits every request at once, prefills all prompts in one step, then decodes every unfinished
request in each later step. A step moves its bytes at the copy bandwidth and does its FLOPs at the matmul rate, both
measured in the same run (`measure_limits`), and takes the longer of the two. A run's share of the ideal is the ideal
time over the measured one.

Bytes of a step: every weight it reads once, as the checkpoint stores it (for a mixture of experts, the routed experts
its rows are expected to reach; an untied input embedding only has rows gathered and is not counted), each attention
layer's K/V of every context token read once (a sliding-window layer's last `window` tokens) and each new token's K/V
written once; activations, logits and linear-attention states are not counted. FLOPs per token: 2 per weight it
multiplies, 2 * hidden * vocab for the LM head where a token is sampled, 4 * heads * head_dim per attention layer and
(query, context token) pair.
"""

import json
import math
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from bench.workload import Request

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_FLOAT_TYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_TYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_full_layers: int  # attention layers that keep every token's K/V
    num_window_layers: int = 0  # sliding-window layers: K/V of the last `window` tokens
    window: int = 0
    dense_bytes: int = 0  # weights every step reads (norms, attention, dense MLPs, shared experts, the LM head)
    expert_bytes: int = 0  # every routed expert of every layer
    num_experts: int = 0
    num_experts_per_token: int = 0
    linear_params_per_token: int = 0  # weights one token multiplies, its experts only (the LM head apart)
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 0  # the KV cache's element (0: the model's dtype)

    @staticmethod
    def from_dir(model_dir: str | Path, dtype_bytes: int = 2) -> "ModelShape":
        """From a checkpoint directory: the weights' bytes from its safetensors headers (a directory without weights,
        for `--load-format dummy`: from transformers' model of its config), the rest from config.json."""
        directory = Path(model_dir)
        config = json.loads((directory / "config.json").read_text())
        config = config.get("text_config", config)
        tensors = {name: meta for path in sorted(directory.glob("*.safetensors")) for name, meta in _header(path)}
        tensors = tensors or _tensors_of_config(directory)
        heads = int(config["num_attention_heads"])
        layer_types = config.get("layer_types") or ["full_attention"] * int(config["num_hidden_layers"])
        num_experts = int(config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
                          or 0)
        shape = ModelShape(
            hidden_size=int(config["hidden_size"]), vocab_size=int(config["vocab_size"]), num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            num_full_layers=layer_types.count("full_attention"),
            num_window_layers=layer_types.count("sliding_attention"), window=int(config.get("sliding_window") or 0),
            num_experts=num_experts, num_experts_per_token=int(config.get("num_experts_per_tok") or 0),
            dtype_bytes=dtype_bytes)
        return _with_weights(shape, tensors, "lm_head.weight" in tensors)

    def per_rank(self, tensor_parallel_size: int) -> "ModelShape":
        """One tensor-parallel rank: its share of the weights and query heads, its KV heads (one at least: fewer KV
        heads than ranks are replicated). The ranks work at once, so a step's ideal is one rank's (no all-reduce)."""
        tp = tensor_parallel_size
        return replace(self, num_heads=self.num_heads // tp, num_kv_heads=max(1, self.num_kv_heads // tp),
                       dense_bytes=self.dense_bytes // tp, expert_bytes=self.expert_bytes // tp,
                       linear_params_per_token=self.linear_params_per_token // tp, vocab_size=-(-self.vocab_size // tp))

    @property
    def kv_bytes_per_token_and_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * (self.kv_dtype_bytes or self.dtype_bytes)

    def weight_bytes(self, num_rows: int) -> float:
        """Weights a step of `num_rows` token rows reads."""
        return self.dense_bytes + self.expert_bytes * self.experts_reached(num_rows)

    def experts_reached(self, num_rows: int) -> float:
        """The expected share of a layer's routed experts that `num_rows` rows reach, each row picking
        `num_experts_per_token` of them uniformly: 1 - (1 - k/E)^rows."""
        if not self.num_experts:
            return 0.0
        return 1.0 - (1.0 - self.num_experts_per_token / self.num_experts) ** num_rows

    def kv_bytes(self, context_lens: list[int]) -> int:
        """K/V read for rows of these context lengths."""
        windowed = sum(min(c, self.window) for c in context_lens) if self.num_window_layers else 0
        return (sum(context_lens) * self.num_full_layers + windowed * self.num_window_layers) \
            * self.kv_bytes_per_token_and_layer

    @property
    def kv_bytes_per_new_token(self) -> int:
        return (self.num_full_layers + self.num_window_layers) * self.kv_bytes_per_token_and_layer

    @property
    def lm_head_flops_per_row(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    @property
    def attention_flops_per_pair(self) -> int:
        return 4 * self.num_heads * self.head_dim * (self.num_full_layers + self.num_window_layers)


def _header(path: Path) -> list[tuple[str, dict[str, object]]]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return [(name, meta) for name, meta in header.items() if name != "__metadata__"]


def _tensors_of_config(directory: Path) -> dict[str, dict[str, object]]:
    """The tensors a checkpoint of this config.json would hold (transformers' names and shapes), as floating ones."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    return {name: {"shape": list(p.shape), "dtype": "BF16"} for name, p in model.named_parameters()}


def _with_weights(shape: ModelShape, tensors: dict[str, dict[str, object]], is_untied: bool) -> ModelShape:
    """Adds up the checkpoint's tensors: bytes per step (routed experts apart) and the weights a token multiplies."""
    dense = experts = params = 0
    for name, meta in tensors.items():
        numel = math.prod(int(n) for n in meta["shape"])  # type: ignore[attr-defined]
        dtype = str(meta["dtype"])
        is_float = dtype in _FLOAT_TYPES
        nbytes = numel * (1 if dtype.startswith("F8") else shape.dtype_bytes if is_float else _TYPE_BYTES.get(dtype, 1))
        if is_untied and name.endswith("embed_tokens.weight"):
            continue  # rows gathered, not read whole
        is_expert = ".experts." in name
        dense, experts = (dense, experts + nbytes) if is_expert else (dense + nbytes, experts)
        if "embed_tokens" in name or "lm_head" in name or len(meta["shape"]) < 2:  # type: ignore[arg-type]
            continue
        weights = numel if is_float else nbytes * 2  # a packed integer tensor: 4-bit weights
        share = shape.num_experts_per_token / shape.num_experts if is_expert and shape.num_experts else 1.0
        params += int(weights * share)
    return replace(shape, dense_bytes=dense, expert_bytes=experts, linear_params_per_token=params)


@dataclass(frozen=True)
class DeviceLimits:
    copy_bytes_per_s: float  # bytes read + written per second by a large device-to-device copy
    matmul_flops_per_s: float

    def figures(self) -> dict[str, float]:
        return {"copy_tb_per_s": round(self.copy_bytes_per_s / 1e12, 4),
                "matmul_tflop_per_s": round(self.matmul_flops_per_s / 1e12, 1)}


@dataclass(frozen=True)
class StepCost:
    num_bytes: float
    num_flops: float

    def seconds(self, limits: DeviceLimits) -> float:
        return max(self.num_bytes / limits.copy_bytes_per_s, self.num_flops / limits.matmul_flops_per_s)


def prefill_cost(shape: ModelShape, prompt_lens: list[int]) -> StepCost:
    """One step that prefills every prompt and samples each one's first token."""
    num_tokens = sum(prompt_lens)
    num_bytes = shape.weight_bytes(num_tokens) + 2 * num_tokens * shape.kv_bytes_per_new_token  # written, read once
    pairs = sum(p * (p + 1) // 2 for p in prompt_lens)  # causal: query j attends to j + 1 tokens
    flops = (2 * num_tokens * shape.linear_params_per_token + len(prompt_lens) * shape.lm_head_flops_per_row
             + pairs * shape.attention_flops_per_pair)
    return StepCost(num_bytes, flops)


def decode_cost(shape: ModelShape, context_lens: list[int]) -> StepCost:
    """One decode step: each row feeds one token whose context (itself included) has the given length."""
    num_rows = len(context_lens)
    num_bytes = shape.weight_bytes(num_rows) + shape.kv_bytes(context_lens) + num_rows * shape.kv_bytes_per_new_token
    flops = (num_rows * (2 * shape.linear_params_per_token + shape.lm_head_flops_per_row)
             + sum(context_lens) * shape.attention_flops_per_pair)
    return StepCost(num_bytes, flops)


@dataclass(frozen=True)
class IdealRun:
    seconds: float
    num_output_tokens: int
    num_steps: int
    num_bytes: float
    num_flops: float

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
    return IdealRun(seconds=sum(s.seconds(limits) for s in steps),
                    num_output_tokens=sum(r.max_tokens for r in requests), num_steps=len(steps),
                    num_bytes=sum(s.num_bytes for s in steps), num_flops=sum(s.num_flops for s in steps))


def measure_limits(device: torch.device, dtype: torch.dtype) -> DeviceLimits:
    """A large device-to-device copy (bytes read + written) and a large square matmul in `dtype`, on random data
    (zeros can run faster), medians of timed repeats. On a CPU, smaller sizes: figures for the CPU smoke runs."""
    is_cuda = device.type == "cuda"
    limits = DeviceLimits(copy_bytes_per_s=_copy_rate(device, (2 << 30) if is_cuda else (16 << 20)),
                          matmul_flops_per_s=_matmul_rate(device, 8192 if is_cuda else 256, dtype))
    if is_cuda:
        torch.cuda.empty_cache()  # the memory back to the engine before it sizes its KV cache
    print(f"device limits: {limits.figures()}", flush=True)
    return limits


def _copy_rate(device: torch.device, num_bytes: int) -> float:
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / median_seconds(lambda: dst.copy_(src), device)


def _matmul_rate(device: torch.device, n: int, dtype: torch.dtype) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / median_seconds(lambda: a @ b, device)


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin)
    return statistics.median(samples)
