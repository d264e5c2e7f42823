"""The attention backend interface and the choice of backend at start-up.

Order for `auto`: flash-attn when it imports and the block size suits its paged kernels (CUDA
only), our Triton kernels on CUDA otherwise, the torch reference on CPU.
"""

import importlib.util
import logging
from typing import Protocol

import torch

from gpu.attention import torch_ref
from gpu.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)


class AttentionBackend(Protocol):
    name: str
    # Whether decode steps may be captured in a CUDA graph (no host syncs, no data-dependent shapes).
    supports_cuda_graphs: bool

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
    ) -> torch.Tensor: ...


class TorchBackend:
    name = "torch"
    supports_cuda_graphs = False  # boolean-mask indexing and per-row host loops

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:  # noqa: ANN001
        torch_ref.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(self, query, k_cache, v_cache, meta, scale) -> torch.Tensor:  # noqa: ANN001
        return torch_ref.attention_forward(query, k_cache, v_cache, meta, scale)


def select_backend(requested: str, device: torch.device, block_size: int) -> AttentionBackend:
    name = _resolve(requested, device, block_size)
    if name == "torch":
        backend: AttentionBackend = TorchBackend()
    elif name == "triton":
        from gpu.attention.triton_backend import TritonBackend

        backend = TritonBackend()
    else:
        from gpu.attention.flash_backend import FlashAttnBackend, check_block_size

        check_block_size(block_size)
        backend = FlashAttnBackend()
    logger.info("attention backend: %s (requested %s, device %s)", backend.name, requested, device)
    return backend


def _resolve(requested: str, device: torch.device, block_size: int) -> str:
    if device.type != "cuda":
        if requested not in ("auto", "torch"):
            raise ValueError(f"attention backend {requested!r} needs CUDA; this device is {device}")
        return "torch"
    if requested != "auto":
        return requested
    has_flash_attn = importlib.util.find_spec("flash_attn") is not None
    return "flash-attn" if has_flash_attn and block_size % 256 == 0 else "triton"
