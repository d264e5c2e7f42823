"""The attention layer of a decoder block: project, rotate, write K/V to the cache, attend.

The layer owns no cache: the runner hands it this layer's (k_cache, v_cache) after allocating them.
On CUDA, when triton is installed, one Triton kernel (gpu/kernels/qk_norm_rope.py) reads the fused QKV
output, applies the per-head q/k norms and the rotation, and writes the step's keys and values to the
cache; elsewhere, or built with `KernelConfig.fused_kernels` off, the torch layers run (the reference the
kernel is tested against) and the backend's store_kv writes the cache. Triton is imported on the first
CUDA call only. Under tensor parallelism a layer holds only its rank's query heads and the KV
heads they read (`kv_heads_of_rank`): its q/k/v rows, its KV cache and its attention; `o_proj` sums
the ranks' outputs.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from gpu.attention.backend import AttentionBackend
from gpu.attention.metadata import AttentionMetadata
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.distributed import SINGLE, TensorParallel
from gpu.kernels import HAS_TRITON
from gpu.layers.linear import MergedLinear, RowSlice
from gpu.layers.norm import NormInput, RMSNorm
from gpu.layers.parallel_linear import RowParallelLinear
from gpu.layers.rotary import RotaryEmbedding


class DecoderAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary: RotaryEmbedding, has_qk_norm: bool,
                 kernels: KernelConfig = DEFAULT_KERNELS, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // total_heads
        self.scale = self.head_dim**-0.5
        # This rank's heads (all of them at tensor-parallel size 1): its KV cache and attention hold only these.
        first_head, self.num_heads = tp.split(total_heads, "the number of attention heads")
        first_kv_head, self.num_kv_heads = kv_heads_of_rank(total_kv_heads, tp)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        has_bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        q_rows = RowSlice(first_head * self.head_dim, q_size, total_heads * self.head_dim)
        kv_rows = RowSlice(first_kv_head * self.head_dim, kv_size, total_kv_heads * self.head_dim)
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": q_rows, "k": kv_rows, "v": kv_rows}, has_bias, kernels)
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size,
                                        bool(getattr(config, "attention_bias", False)), tp, kernels)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels) if has_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels) if has_qk_norm else None
        self.rotary = rotary
        self.backend: AttentionBackend | None = None
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.kernels = kernels

    def forward(self, positions: torch.Tensor, hidden: NormInput, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention over norm(x + residual), x + residual)."""
        qkv, residual = self.qkv_proj.forward_normed(hidden)  # [num_tokens, q_size + 2 * kv_size]
        num_tokens = qkv.shape[0]
        assert self.backend is not None, "the runner sets the backend before the first forward"
        if self._is_fused(qkv):
            q = self._fused_q_storing_kv(positions, qkv, meta.slot_mapping)
        else:
            q, k = self._torch_qk(positions, qkv)
            v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
            self.backend.store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        out = self.backend.forward(q, self.k_cache, self.v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, -1)), residual

    def _torch_qk(self, positions: torch.Tensor, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens = qkv.shape[0]
        if self.q_norm is None and not qkv.is_cuda:
            # Query and key heads rotated in one go (on a CPU each operation's dispatch counts); they stay
            # views of one tensor, which CUDA's attention kernels would have to be checked to take.
            heads = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, self.head_dim)
            rotated = self.rotary.rotate(positions, heads)
            return rotated[:, : self.num_heads], rotated[:, self.num_heads :]
        q = qkv[:, : self.q_size].view(num_tokens, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.rotary(positions, q, k)

    def _is_fused(self, qkv: torch.Tensor) -> bool:
        is_pow2 = (self.head_dim & (self.head_dim - 1)) == 0  # the kernel's head halves are power-of-two ranges
        return self.kernels.fused_kernels and HAS_TRITON and qkv.is_cuda and is_pow2 and qkv.stride(1) == 1

    def _fused_q_storing_kv(self, positions: torch.Tensor, qkv: torch.Tensor, slot_mapping: torch.Tensor
                            ) -> torch.Tensor:
        """q from the kernel, which writes this step's K and V to the cache itself: every backend reads the one
        cache layout (gpu/attention/metadata.py) that backend.store_kv would write."""
        from gpu.kernels.qk_norm_rope import qk_norm_rope_store_kv

        heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        return qk_norm_rope_store_kv(qkv, positions, (self.rotary.cos, self.rotary.sin), heads, *self._qk_norms(),
                                     (self.k_cache, self.v_cache, slot_mapping), use_pdl=True)

    def _qk_norms(self) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, float]:
        """(q_norm and k_norm weights, or None without them; their eps)."""
        if self.q_norm is None or self.k_norm is None:
            return None, 0.0
        return (self.q_norm.weight, self.k_norm.weight), self.q_norm.eps


def kv_heads_of_rank(num_kv_heads: int, tp: TensorParallel) -> tuple[int, int]:
    """(first, count) of the KV heads a rank holds: an equal share when there are at least as many KV
    heads as ranks; else one head, replicated on size / num_kv_heads ranks (the one its query heads read)."""
    if num_kv_heads >= tp.size:
        return tp.split(num_kv_heads, "the number of key/value heads")
    if tp.size % num_kv_heads:
        raise ValueError(f"the tensor-parallel size ({tp.size}) must be a multiple of the number of key/value "
                         f"heads ({num_kv_heads}) when it exceeds it")
    return tp.rank * num_kv_heads // tp.size, 1
