"""The attention layer of a decoder block: project, normalize, rotate, write K/V to the cache, attend.

A layer is built from its `AttentionSpec`, which a family derives from its config for each layer (gpu/models/):
its heads, scale, biases, per-head norms, and its variant of attention (sliding window, sinks, soft-cap:
gpu/attention/variant.py), which every backend runs. Two Gemma 4 forms: a layer whose values are its keys before
their norm (`values_are_keys`, no v projection), and a layer that computes no K/V and reads the cache of an
earlier layer of its type (`read_kv_of`, called by the family): such a layer owns no cache.

The layer owns no cache: the runner hands it this layer's (k_cache, v_cache) after allocating them, and its KV-cache
group (gpu/kv_cache_groups.py), whose slot mapping and block tables it writes and reads. An FP8 cache
(`--kv-cache-dtype fp8`) holds fp8(key / k_scale) and fp8(value / v_scale), the division in float32, with the
checkpoint's per-layer `self_attn.k_scale` and `v_scale` where it has them (else 1; `use_fp8_cache`); attention
then reads keys as fp8 * k_scale (the softmax scale times k_scale) and values as fp8 * v_scale (the output times
v_scale), so every backend reads the cache's bytes as they are. The scales are the layer's own, whatever its group.
On CUDA, when triton is installed, one Triton kernel (gpu/kernels/qk_norm_rope.py) reads the fused QKV
output, applies the per-head q/k norms and the rotation, and writes the step's keys and values to the
cache, for a whole rotation over a power-of-two head or a partial one within its first half, reading the queries
from between their gates where q_proj's rows are [query; gate] per head (the gates then a view of the projection);
on a CPU where the runner hands the layer gpu/cpu_kernels/attention.c, its `rope_store` does the same in one call,
for a whole rotation and Llama-style q/k norms; elsewhere (a partial rotation past half a head, a value norm, values
that are keys), or built with `KernelConfig.fused_kernels` off, the torch layers run (the reference the kernels are
tested against) and the backend's store_kv writes the cache.
Triton is imported on the first CUDA call only. Under tensor
parallelism a layer holds only its rank's query heads (and their sinks) and the KV heads they read
(`kv_heads_of_rank`): its q/k/v rows, its KV cache and its attention; `o_proj` sums the ranks' outputs.
"""

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from gpu.attention.backend import AttentionBackend
from gpu.attention.metadata import AttentionMetadata
from gpu.attention.variant import PLAIN, AttentionVariant
from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.cpu_kernels import ACTIVATION_DTYPES
from gpu.distributed import SINGLE, TensorParallel
from gpu.kernels import HAS_TRITON
from gpu.layers.activation import times_sigmoid
from gpu.layers.linear import MergedLinear, RowSlice
from gpu.layers.norm import NormConvention, NormInput, RMSNorm
from gpu.layers.parallel_linear import RowParallelLinear
from gpu.layers.rotary import RotaryEmbedding
from gpu.loader import CheckpointTensor


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention as its family and config define it (head counts over all ranks)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: NormConvention | None = None  # per-head RMSNorm of queries and keys (Qwen3, Gemma), by this convention
    has_value_norm: bool = False  # Gemma 4: values RMS-normed too, without a weight
    values_are_keys: bool = False  # Gemma 4's full layers with attention_k_eq_v: v is k before its norm
    computes_kv: bool = True  # False: a layer that reads an earlier layer's cache (Gemma 4's shared KV)
    sliding_window: int | None = None
    softcap: float | None = None
    has_sinks: bool = False  # a learned logit per head in every softmax's denominator (gpt-oss)
    # The output multiplied by sigmoid(gate) before o_proj, the gate projected with the query: q_proj's rows are
    # [query; gate] per head (Qwen3-Next, Qwen3.5).
    has_output_gate: bool = False
    input_size: int | None = None  # of the q/k/v projections where not hidden_size (EAGLE-3's [embedding; hidden])


class DecoderAttention(nn.Module):
    def __init__(self, spec: AttentionSpec, rotary: RotaryEmbedding, kernels: KernelConfig = DEFAULT_KERNELS,
                 tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.spec = spec
        self.head_dim = spec.head_dim
        self.scale = spec.scale
        # This rank's heads (all of them at tensor-parallel size 1): its KV cache and attention hold only these.
        first_head, self.num_heads = tp.split(spec.num_heads, "the number of attention heads")
        first_kv_head, self.num_kv_heads = kv_heads_of_rank(spec.num_kv_heads, tp)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        q_width = 2 * self.head_dim if spec.has_output_gate else self.head_dim  # rows per head
        q_rows = RowSlice(first_head * q_width, self.num_heads * q_width, spec.num_heads * q_width)
        kv_rows = RowSlice(first_kv_head * self.head_dim, kv_size, spec.num_kv_heads * self.head_dim)
        shards = {"q": q_rows, "k": kv_rows, "v": kv_rows}
        if not spec.computes_kv or spec.values_are_keys:
            shards = {"q": q_rows} if not spec.computes_kv else {"q": q_rows, "k": kv_rows}
        self.qkv_proj = MergedLinear(spec.input_size or spec.hidden_size, shards, spec.qkv_bias, kernels)
        self.o_proj = RowParallelLinear(spec.num_heads * self.head_dim, spec.hidden_size, spec.o_bias, tp, kernels)
        norm = spec.qk_norm
        self.q_norm = RMSNorm(self.head_dim, spec.norm_eps, kernels, norm) if norm is not None else None
        self.k_norm = RMSNorm(self.head_dim, spec.norm_eps, kernels, norm) if norm and spec.computes_kv else None
        self.v_norm = (RMSNorm(self.head_dim, spec.norm_eps, kernels, norm or NormConvention(), has_weight=False)
                       if spec.has_value_norm and spec.computes_kv else None)
        self.sinks = self._sinks_parameter(first_head) if spec.has_sinks else None
        self.variant = (AttentionVariant(spec.sliding_window, self.sinks, spec.softcap)
                        if spec.sliding_window is not None or spec.has_sinks or spec.softcap is not None else PLAIN)
        self.rotary = rotary
        self.backend: AttentionBackend | None = None
        self.cpu_kernels: ModuleType | None = None  # on a CPU: gpu/cpu_kernels/attention.c, set by the runner
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self._kv_source: tuple[DecoderAttention, ...] = ()  # a tuple: the source is not a submodule of this layer
        self.kv_group = 0  # its KV-cache group, whose slots and block tables it uses (the runner sets it)
        self.kernels = kernels
        self.kv_scales = (1.0, 1.0)  # (k_scale, v_scale) of this layer's cache: 1 unless it is FP8
        self._checkpoint_kv_scales = [1.0, 1.0]
        self.k_scale = self._kv_scale_parameter(0)
        self.v_scale = self._kv_scale_parameter(1)

    @property
    def owns_kv_cache(self) -> bool:
        return self.spec.computes_kv

    @property
    def kv_source(self) -> "DecoderAttention | None":
        """The layer whose cache this one reads (None: its own)."""
        return self._kv_source[0] if self._kv_source else None

    def use_fp8_cache(self) -> None:
        """This layer's cache is FP8: keys and values scaled by the checkpoint's scales (1 where it has none)."""
        self.kv_scales = (self._checkpoint_kv_scales[0], self._checkpoint_kv_scales[1])

    def read_kv_of(self, source: "DecoderAttention") -> None:
        """Attend over `source`'s cache (a layer whose spec computes no K/V)."""
        if self.spec.computes_kv or not source.owns_kv_cache:
            raise ValueError("only a layer that computes no K/V reads another's cache, which must own one")
        self._kv_source = (source,)

    def forward(self, positions: torch.Tensor, hidden: NormInput, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention over norm(x + residual), x + residual)."""
        qkv, residual = self.qkv_proj.forward_normed(hidden)  # [num_tokens, q_size (+ kv_size (+ kv_size))]
        return self._attend(positions, qkv, meta), residual

    def forward_normed_input(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention over an input its caller normed (EAGLE-3's [normed embedding; normed hidden state])."""
        return self._attend(positions, self.qkv_proj(x), meta)

    def _attend(self, positions: torch.Tensor, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = qkv.shape[0]
        assert self.backend is not None, "the runner sets the backend before the first forward"
        meta = meta.of_group(self.kv_group)
        q = self._query_storing_kv(positions, qkv, meta.slot_mapping)
        source = self._kv_source[0] if self._kv_source else self
        k_scale, v_scale = source.kv_scales
        out = self.backend.forward(q, source.k_cache, source.v_cache, meta, self.scale * k_scale, self.variant)
        if v_scale != 1.0:
            out = out * v_scale
        if self.spec.has_output_gate:
            out = times_sigmoid(out.reshape(num_tokens, self.num_heads, self.head_dim), self._output_gate(qkv),
                                self.kernels)
        return self.o_proj(out.reshape(num_tokens, -1))

    def _output_gate(self, qkv: torch.Tensor) -> torch.Tensor:
        """The gates [num_tokens, heads, head_dim] of q_proj's [query; gate] rows per head: a view of qkv (one
        operation: a prompt step pays each one's host time)."""
        column = qkv.stride(1)
        return qkv.as_strided((qkv.shape[0], self.num_heads, self.head_dim),
                              (qkv.stride(0), 2 * self.head_dim * column, column),
                              qkv.storage_offset() + self.head_dim * column)

    def _without_output_gates(self, qkv: torch.Tensor) -> torch.Tensor:
        """[q; k; v] without q_proj's gate rows: the torch path's queries, a copy."""
        num_tokens = qkv.shape[0]
        query_gate = qkv[:, : 2 * self.q_size].view(num_tokens, self.num_heads, 2 * self.head_dim)
        q = query_gate[..., : self.head_dim].reshape(num_tokens, self.q_size)
        return torch.cat((q, qkv[:, 2 * self.q_size :]), dim=-1)

    def _query_storing_kv(self, positions: torch.Tensor, qkv: torch.Tensor, slot_mapping: torch.Tensor
                          ) -> torch.Tensor:
        """The rotated queries; this step's keys and values written to the cache (a layer that computes them)."""
        assert self.backend is not None
        num_tokens = qkv.shape[0]
        if self.spec.computes_kv and self._is_fused(qkv):
            return self._fused_q_storing_kv(positions, qkv, slot_mapping)
        if self.spec.has_output_gate:
            qkv = self._without_output_gates(qkv)
        if not self.spec.computes_kv:
            q = qkv.view(num_tokens, self.num_heads, self.head_dim)
            return self.rotary.rotate(positions, self.q_norm(q) if self.q_norm is not None else q)
        if self.runs_cpu_kernel(qkv.dtype, qkv.stride(1)):
            return self._cpu_q_storing_kv(positions, qkv, slot_mapping)
        q, k = self._torch_qk(positions, qkv)
        if self.spec.values_are_keys:
            v = qkv[:, self.q_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        else:
            v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.v_norm is not None:
            v = self.v_norm(v)
        if self.kv_scales != (1.0, 1.0):
            k, v = k.float() / self.kv_scales[0], v.float() / self.kv_scales[1]
        self.backend.store_kv(k, v, self.k_cache, self.v_cache, slot_mapping)
        return q

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
        is_plain_kv = not (self.spec.values_are_keys or self.spec.has_value_norm)  # the kernel copies the values
        return (self.kernels.fused_kernels and HAS_TRITON and qkv.is_cuda and is_pow2 and qkv.stride(1) == 1
                and self.kernel_rotates and is_plain_kv)

    @property
    def kernel_rotates(self) -> bool:
        """Whether qk_norm_rope's rotation is this layer's: a whole head, or a partial one within its first half (the
        kernel pairs the turned dims within the half it holds)."""
        rotary_dim = self.rotary.rotary_dim  # even: two per frequency
        return rotary_dim == self.head_dim or 2 <= rotary_dim <= self.head_dim // 2

    def _fused_q_storing_kv(self, positions: torch.Tensor, qkv: torch.Tensor, slot_mapping: torch.Tensor
                            ) -> torch.Tensor:
        """q from the kernel, which writes this step's K and V to the cache itself: every backend reads the one
        cache layout (gpu/attention/metadata.py) that backend.store_kv would write."""
        from gpu.kernels.qk_norm_rope import qk_norm_rope_store_kv

        heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        weights, eps, convention = self.qk_norms()
        return qk_norm_rope_store_kv(qkv, positions, (self.rotary.cos, self.rotary.sin), heads, weights, eps,
                                     (self.k_cache, self.v_cache, slot_mapping), use_pdl=True,
                                     norm_convention=convention, kv_scales=self.kv_scales,
                                     has_output_gate=self.spec.has_output_gate)

    def runs_cpu_kernel(self, dtype: torch.dtype, column_stride: int = 1) -> bool:
        """Whether gpu/cpu_kernels/attention.c rotates and stores this layer's q/k/v of `dtype`: a whole rotation,
        q/k norms (either convention) or none, plain values, and the cache (unscaled), rotary tables and norms in
        that dtype."""
        is_plain_kv = not (self.spec.values_are_keys or self.spec.has_value_norm) and self.spec.computes_kv
        norms_in_dtype = self.q_norm is None or self.q_norm.weight.dtype == self.k_norm.weight.dtype == dtype
        is_unscaled = self.kv_scales == (1.0, 1.0)  # an FP8 cache's scales: the torch code divides by them
        return (self.cpu_kernels is not None and dtype in ACTIVATION_DTYPES and column_stride == 1 and is_plain_kv
                and is_unscaled and norms_in_dtype and self.rotary.rotary_dim == self.head_dim
                and self.head_dim % 2 == 0 and self.head_dim <= 1024
                and dtype == self.k_cache.dtype == self.rotary.cos.dtype == self.rotary.signed_sin.dtype)

    def _cpu_q_storing_kv(self, positions: torch.Tensor, qkv: torch.Tensor, slot_mapping: torch.Tensor
                          ) -> torch.Tensor:
        """q [num_tokens, num_heads, head_dim] rotated by the C kernel, which writes this step's rotated keys and the
        values to the cache itself."""
        assert self.cpu_kernels is not None
        num_tokens = qkv.shape[0]
        q = torch.empty(num_tokens, self.num_heads, self.head_dim, dtype=qkv.dtype)
        norms, eps, (offset, in_float32) = self.qk_norms()
        q_norm, k_norm = (None, None) if norms is None else (norms[0].data_ptr(), norms[1].data_ptr())
        self.cpu_kernels.rope_store(
            qkv.data_ptr(), qkv.stride(0), num_tokens, positions.data_ptr(), self.rotary.cos.data_ptr(),
            self.rotary.signed_sin.data_ptr(), self.num_heads, self.num_kv_heads, self.head_dim, q_norm, k_norm,
            float(eps), self.k_cache.data_ptr(), self.v_cache.data_ptr(), slot_mapping.data_ptr(), q.data_ptr(),
            int(qkv.dtype == torch.bfloat16), float(offset), int(in_float32))
        return q

    def qk_norms(self) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, float, tuple[float, bool]]:
        """(q_norm and k_norm weights, or None without them; their eps; their convention for the kernels: weight
        offset, and whether they scale in float32)."""
        if self.q_norm is None or self.k_norm is None:
            return None, 0.0, (0.0, False)
        convention = self.q_norm.convention
        return (self.q_norm.weight, self.k_norm.weight), self.q_norm.eps, (convention.weight_offset,
                                                                            convention.scales_in_float32)

    def _kv_scale_parameter(self, index: int) -> nn.Parameter:
        """The checkpoint's `k_scale` (index 0) or `v_scale` (1) of an FP8 KV cache, kept as a float32 value here
        (a 1-element parameter would take the model's dtype); optional: a checkpoint without them gets 1."""
        param = nn.Parameter(torch.ones(()), requires_grad=False)

        def load(param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
            if loaded.shape not in ((), (1,)):
                raise ValueError(f"{loaded.name}: a KV-cache scale is one value, got shape {loaded.shape}")
            self._checkpoint_kv_scales[index] = float(loaded.read().float().reshape(()))

        param.weight_loader = load  # type: ignore[attr-defined]
        param.is_optional = True  # type: ignore[attr-defined]
        return param

    def _sinks_parameter(self, first_head: int) -> nn.Parameter:
        """This rank's heads' sink logits; the checkpoint's `sinks` holds every head's."""
        sinks = nn.Parameter(torch.zeros(self.num_heads))

        def load(param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
            if loaded.shape != (self.spec.num_heads,):
                raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != {(self.spec.num_heads,)}")
            param.data.copy_(loaded.read_rows(first_head, self.num_heads))

        sinks.weight_loader = load  # type: ignore[attr-defined]
        return sinks


def kv_heads_of_rank(num_kv_heads: int, tp: TensorParallel) -> tuple[int, int]:
    """(first, count) of the KV heads a rank holds: an equal share when there are at least as many KV
    heads as ranks; else one head, replicated on size / num_kv_heads ranks (the one its query heads read)."""
    if num_kv_heads >= tp.size:
        return tp.split(num_kv_heads, "the number of key/value heads")
    if tp.size % num_kv_heads:
        raise ValueError(f"the tensor-parallel size ({tp.size}) must be a multiple of the number of key/value "
                         f"heads ({num_kv_heads}) when it exceeds it")
    return tp.rank * num_kv_heads // tp.size, 1
