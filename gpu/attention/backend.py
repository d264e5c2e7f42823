"""The attention backend interface, the backends by name, and a backend per step phase.

A step is in one of two phases: decode-only (one query per row) or anything else (prefill chunks,
prefix-cache hits, decode rows mixed with prefill). `PhasedBackend` routes each phase to its own
backend; the runner builds it at start-up (gpu/backend_choice.py measures which is faster per
phase for `auto`). Backends that can run here: `torch` anywhere (the reference), `cpu` (the
reference's math in fewer operations, gpu/attention/cpu_backend.py) on a CPU, `triton` on CUDA,
`flash-attn` (FlashAttention-4) on CUDA GPUs of compute capability 9.x-11.x in float16 or
bfloat16 when `flash_attn.cute` is installed.
"""

import importlib.util
from types import ModuleType
from typing import Protocol

import torch

from gpu.attention import torch_ref
from gpu.attention.metadata import AttentionMetadata
from gpu.attention.qkv_heads import QkvHeads
from gpu.attention.variant import PLAIN, AttentionVariant

BACKEND_NAMES = ("torch", "cpu", "triton", "flash-attn")


class AttentionBackend(Protocol):
    name: str
    # Whether decode steps may be captured in a CUDA graph (no host syncs, no data-dependent shapes).
    supports_cuda_graphs: bool
    # Whether other steps may be captured too, padded to a token bucket with empty padding rows
    # (the launch grid then depends only on the padded shapes).
    supports_mixed_graphs: bool
    # Whether a decode-only step's attention may start from the raw QKV projection (`decode_from_qkv`): the q/k norms,
    # the rotation and the store of the step's K/V then run in the attention's own launch.
    decodes_from_qkv: bool

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        variant: AttentionVariant = PLAIN,  # the layer's window, sinks, soft-cap (gpu/attention/variant.py)
    ) -> torch.Tensor: ...

    def decode_from_qkv(
        self,
        qkv: torch.Tensor,  # [num_rows, columns of the heads], one token per row
        positions: torch.Tensor,  # [num_rows] int64
        layout: QkvHeads,
        kv_cache: tuple[torch.Tensor, torch.Tensor],  # (k_cache, v_cache), this step's K/V written there
        meta: AttentionMetadata,  # a decode-only step's
        scale: float,
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor: ...  # only where decodes_from_qkv: what store + forward of the normed, rotated q would give


class TorchBackend:
    name = "torch"
    supports_cuda_graphs = False  # boolean-mask indexing and per-row host loops
    supports_mixed_graphs = False
    decodes_from_qkv = False

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:  # noqa: ANN001
        torch_ref.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query, k_cache, v_cache, meta, scale, variant=PLAIN) -> torch.Tensor:  # noqa: ANN001
        return torch_ref.attention_forward(query, k_cache, v_cache, meta, scale, variant)


class PhasedBackend:
    """Decode-only steps to one backend, every other step to another (possibly the same)."""

    def __init__(self, decode: AttentionBackend, prefill: AttentionBackend) -> None:
        self.decode, self.prefill = decode, prefill
        self.name = decode.name if decode.name == prefill.name else f"decode={decode.name}, prefill={prefill.name}"
        self.supports_cuda_graphs = decode.supports_cuda_graphs
        self.supports_mixed_graphs = prefill.supports_mixed_graphs
        self.decodes_from_qkv = decode.decodes_from_qkv

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:  # noqa: ANN001
        # Every backend writes the one cache layout (metadata.py), so either may write it.
        self.prefill.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query, k_cache, v_cache, meta, scale, variant=PLAIN) -> torch.Tensor:  # noqa: ANN001
        backend = self.decode if meta.is_decode_only else self.prefill
        return backend.forward(query, k_cache, v_cache, meta, scale, variant)

    def decode_from_qkv(self, qkv, positions, layout, kv_cache, meta, scale, variant=PLAIN) -> torch.Tensor:  # noqa: ANN001
        return self.decode.decode_from_qkv(qkv, positions, layout, kv_cache, meta, scale, variant)


def backend_named(name: str, cpu_kernels: ModuleType | None = None) -> AttentionBackend:
    """Imports lazily: triton and flash_attn are optional. `cpu_kernels`: the `cpu` backend's C kernels
    (gpu/cpu_kernels/attention.c), where they are built and the fused kernels are on."""
    if name == "torch":
        return TorchBackend()
    if name == "cpu":
        from gpu.attention.cpu_backend import CpuBackend

        return CpuBackend(cpu_kernels)
    if name == "triton":
        from gpu.attention.triton_backend import TritonBackend

        return TritonBackend()
    if name == "flash-attn":
        from gpu.attention.flash_backend import FlashAttnBackend

        return FlashAttnBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose from {BACKEND_NAMES}")


# FA4's head sizes on Hopper (its interface asserts them; Blackwell takes fewer, which it reports at the first call).
FLASH_ATTN_MAX_HEAD_DIM = 256


def flash_attn_unavailable(device: torch.device, dtype: torch.dtype, head_dims: tuple[int, ...] = ()) -> str | None:
    """Why the flash-attn backend cannot run here for layers of these head sizes, or None when it can."""
    if device.type != "cuda":
        return f"it needs CUDA (device {device})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"its kernels take float16 or bfloat16 (dtype {dtype})"
    if any(d > FLASH_ATTN_MAX_HEAD_DIM or d % 8 for d in head_dims):
        return f"its kernels take head sizes of up to {FLASH_ATTN_MAX_HEAD_DIM}, multiples of 8 (this model's: " \
               f"{sorted(set(head_dims))})"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10, 11):  # FA4 reads a paged cache on Hopper and Blackwell only
        return f"its paged kernels need compute capability 9.x-11.x (this GPU: {major}.{minor})"
    if importlib.util.find_spec("flash_attn") is None or importlib.util.find_spec("flash_attn.cute") is None:
        return "flash_attn.cute is not installed (pip install 'openai-serve[flash]')"
    return None


def without_flash_attn_for_fp8_cache(names: list[str], requested: str) -> tuple[list[str], str]:
    """The candidates that read an FP8 KV cache: FA4's paged kernels take none on Hopper (they read the query's
    dtype), so flash-attn is dropped; asked for by name, it is an error."""
    if requested == "flash-attn":
        raise ValueError("attention backend flash-attn reads no FP8 KV cache (--kv-cache-dtype fp8): use triton or "
                         "auto")
    return [name for name in names if name != "flash-attn"], "its kernels read no FP8 KV cache (--kv-cache-dtype fp8)"


def candidate_names(requested: str, device: torch.device, dtype: torch.dtype,
                    head_dims: tuple[int, ...] = ()) -> tuple[list[str], str | None]:
    """The backends to choose between for every phase, and why flash-attn is not among them for `auto`.

    An explicit name is the only candidate (an error when it cannot run here); `auto` is `cpu` on a
    CPU, and on CUDA triton plus flash-attn where it can run.
    """
    if requested not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"unknown attention backend {requested!r}; choose from auto, {', '.join(BACKEND_NAMES)}")
    if device.type != "cuda" and requested not in ("auto", "torch", "cpu"):
        raise ValueError(f"attention backend {requested!r} needs CUDA; this device is {device}")
    if device.type == "cuda" and requested == "cpu":
        raise ValueError("attention backend cpu runs on a CPU; this device is cuda")
    reason = flash_attn_unavailable(device, dtype, head_dims) if device.type == "cuda" else None
    if requested == "flash-attn" and reason is not None:
        raise ValueError(f"attention backend flash-attn cannot run: {reason}")
    if requested != "auto":
        return [requested], None
    if device.type != "cuda":
        return ["cpu"], None
    return (["triton"], reason) if reason is not None else (["triton", "flash-attn"], None)
