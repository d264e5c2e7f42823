"""Linear layers: `Linear` routes inputs of up to 256 rows to the skinny GEMM kernel; `MergedLinear` stacks
several checkpoint tensors (q/k/v, gate/up) into one weight.

`Linear` sends an input of at most MAX_ROWS rows, bf16/fp16, on CUDA (where triton is installed) to
gpu/kernels/skinny_gemm.py, which streams the weight at a higher share of the memory bandwidth than cuBLAS
does for so few rows (and, for 17..256 rows, tiles them better than cuBLAS's heuristics on the H100), unless the
table of the GPU it runs on says cuBLAS is as fast for that shape; anything else goes to F.linear. The choice
depends on shapes, dtypes and the GPU only, so it is the same at every replay of a CUDA graph. A layer built
with `KernelConfig.skinny_gemm` off runs F.linear for 1..16 rows, with `skinny_gemm_many_rows` off for 17..256
(tests and A/B runs compare). The LM head (gpu/layers/vocab_parallel.py) routes through the same `linear`.
At the row counts where the GPU's prologue rule says so (gpu/kernels/skinny_gemm_configs.py: 1 row on the H100,
decode steps at batch 1, where a launch costs more than the bytes it moves), a product also computes its own input
(KernelConfig.norm_prologues, silu_prologues): `forward_normed` takes a block's input before its residual add +
RMSNorm, `forward_silu_and_mul` the gate/up projection before its activation, and where the elementwise step would
have run as its Triton kernel, the skinny kernel's prologue does it. Elsewhere the step runs on its own first.
A [gate; up] layer over many rows (prompt steps) on a GPU where quack's gated GEMM runs computes SiLU-and-mul in its
product's epilogue instead (`forward_normed_silu_and_mul`, gpu/kernels/gated_gemm.py).
`warm_up_skinny_gemm` compiles every row bucket's config before a request. Merging
turns three (or two) matmuls into one; each parameter of a MergedLinear carries a `weight_loader` that copies one
checkpoint shard into its rows. Under tensor parallelism a MergedLinear is column-parallel: each of its shards
holds a `RowSlice` of its checkpoint tensor (this rank's heads, or its share of the MLP) and reads only those rows.
On a CPU in bfloat16 the runner packs each layer's weight after loading (gpu/layers/cpu_linear.py): `packed` then
replaces `weight`.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON, gated_gemm
from gpu.kernels.skinny_gemm_configs import FEW_ROWS, MAX_ROWS, SkinnyConfig, row_bucket
from gpu.layers.activation import SiluAndMul
from gpu.layers.cpu_linear import PackedWeight, pack_weight
from gpu.layers.norm import NormInput
from gpu.loader import CheckpointTensor

SKINNY_DTYPES = (torch.bfloat16, torch.float16)


class Linear(nn.Linear):
    def __init__(
        self, in_features: int, out_features: int, bias: bool, kernels: KernelConfig = DEFAULT_KERNELS
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels
        self.packed: PackedWeight | None = None

    def pack_for_cpu(self) -> str:
        """Replaces the weight by its packed form (the weight's memory is freed); returns the form's kind."""
        self.packed = pack_weight(self.weight.detach())
        self.weight = None  # type: ignore[assignment]
        return self.packed.kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(self._product(x))

    def forward_normed(self, inp: NormInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual): in one kernel where `_prologue_config` gives a config."""
        x = inp.x
        config = self._prologue_config(x, "norm") if x.dim() == 2 and inp.norm.is_fused(x) else None
        if config is not None:
            from gpu.kernels.skinny_gemm import skinny_gemm_rms_norm

            y, summed = skinny_gemm_rms_norm(x, inp.residual, inp.norm.weight, inp.norm.eps, self.weight, self.bias,
                                             config, use_pdl=self.kernels.pdl_launches)
            return self._reduce(y), summed
        normed, summed = inp.compute()
        return self._reduce(self._product(normed)), summed

    def forward_silu_and_mul(self, gate_up: torch.Tensor, act: SiluAndMul) -> torch.Tensor:
        """self(act(gate_up)): in one kernel where `_prologue_config` gives a config."""
        config = self._prologue_config(gate_up[:, : self.in_features], "silu") if act.is_fused(gate_up) else None
        if config is not None:
            from gpu.kernels.skinny_gemm import skinny_gemm_silu_and_mul

            return self._reduce(skinny_gemm_silu_and_mul(gate_up, self.weight, self.bias, config,
                                                         use_pdl=self.kernels.pdl_launches))
        return self._reduce(self._product(act(gate_up)))

    def forward_normed_silu_and_mul(self, inp: NormInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(silu_and_mul(self(norm(x + residual))), x + residual) for a [gate; up] layer, the activation in the
        product's epilogue: where `fuses_silu_and_mul(inp.x)` says so."""
        from gpu.kernels.gated_gemm import silu_and_mul_product

        normed, summed = inp.compute()
        return self._reduce(silu_and_mul_product(normed, self.weight)), summed

    def fuses_silu_and_mul(self, x: torch.Tensor) -> bool:
        """Whether this [gate; up] layer computes SiLU-and-mul in its product's epilogue for input x [M, K]: many rows
        (gpu/kernels/gated_gemm.py's MIN_ROWS), bf16/fp16 on a GPU where the runner found quack's gated GEMM
        working, no bias."""
        return (self.kernels.gated_gemm and self.packed is None and self.bias is None and x.dim() == 2
                and x.shape[0] >= gated_gemm.MIN_ROWS and x.dtype in gated_gemm.DTYPES and x.dtype == self.weight.dtype
                and x.stride(-1) == 1 and self.weight.is_contiguous() and gated_gemm.is_ready(x.device, x.dtype)
                and not (torch.is_grad_enabled() and self.weight.requires_grad))

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x, self.bias)
        return linear(x, self.weight, self.bias, self.kernels)

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        """This layer's output from its product (a row-parallel layer sums the ranks' products here)."""
        return y

    def _is_skinny(self, x: torch.Tensor) -> bool:
        return is_skinny(x, self.weight, self.kernels)

    def _prologue_config(self, x: torch.Tensor, kind: str) -> SkinnyConfig | None:
        """The skinny kernel's config for a product over x [M, in_features] that computes its input (a `kind`
        prologue), or None: the elementwise step runs on its own."""
        enabled = self.kernels.norm_prologues if kind == "norm" else self.kernels.silu_prologues
        if enabled and self.packed is None and runs_on_skinny_kernel(x, self.weight, self.kernels):
            from gpu.kernels.skinny_gemm import prologue_config

            return prologue_config(x.shape[0], self.in_features, kind, x.device)
        return None


def runs_on_skinny_kernel(x: torch.Tensor, weight: torch.Tensor, kernels: KernelConfig) -> bool:
    """Whether the skinny GEMM kernel can take x @ weight.T and is switched on for its rows (the table aside)."""
    num_rows = x.numel() // weight.shape[1]
    is_on = kernels.skinny_gemm if num_rows <= FEW_ROWS else kernels.skinny_gemm_many_rows
    return (is_on and HAS_TRITON and x.is_cuda and x.dtype in SKINNY_DTYPES and x.dtype == weight.dtype
            and 0 < num_rows <= MAX_ROWS and x.stride(-1) == 1 and weight.stride(-1) == 1
            and not (torch.is_grad_enabled() and weight.requires_grad))


def is_skinny(x: torch.Tensor, weight: torch.Tensor, kernels: KernelConfig) -> bool:
    """Whether x @ weight.T runs on the skinny GEMM kernel: the rule of this module's docstring."""
    if not runs_on_skinny_kernel(x, weight, kernels):
        return False
    from gpu.kernels.skinny_gemm import preferred_config

    return preferred_config(x.numel() // weight.shape[1], weight.shape[0], weight.shape[1], x.device) is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernels: KernelConfig,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) over x's last dimension: the skinny GEMM kernel where `is_skinny`, else cuBLAS; with
    `out` (2-d x only) the product is written into it, a buffer the caller reuses (the decode graphs' logits)."""
    if not is_skinny(x, weight, kernels):
        if out is None:
            return F.linear(x, weight, bias)
        return torch.mm(x, weight.t(), out=out) if bias is None else torch.addmm(bias, x, weight.t(), out=out)
    from gpu.kernels.skinny_gemm import skinny_gemm

    y = skinny_gemm(x.reshape(-1, weight.shape[1]), weight, bias, use_pdl=kernels.pdl_launches, out=out)
    return y.view(*x.shape[:-1], weight.shape[0])


def warm_up_skinny_gemm(model: nn.Module, max_rows: int) -> int:
    """Runs the weight of every CUDA layer of `model` that routes through `linear` (a Linear, the LM head: those
    with a `kernels` setting) once per row bucket (1, 2, 4, ..., 256) up to `max_rows` (the most rows a step can
    have), so each bucket's kernel config is compiled before the first request, whichever step shape (a decode
    graph's capture, an eager prefill, the LM head on a step's rows) meets it first. No bias, no all-reduce: only
    what selects a compiled kernel matters. Returns the number of calls made."""
    buckets = sorted({row_bucket(rows) for rows in range(1, min(max_rows, MAX_ROWS) + 1)})
    calls = 0
    for layer in model.modules():
        weight, kernels = getattr(layer, "weight", None), getattr(layer, "kernels", None)
        if isinstance(kernels, KernelConfig) and isinstance(weight, torch.Tensor) and weight.dim() == 2 \
                and weight.is_cuda:  # (a norm's weight is 1-d)
            for rows in buckets:
                linear(torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device), weight, None,
                       kernels)
                calls += 1
    return calls


@dataclass(frozen=True)
class RowSlice:
    """Rows [start, start + size) of a checkpoint tensor that has `total` rows."""

    start: int
    size: int
    total: int

    @staticmethod
    def whole(total: int) -> "RowSlice":
        return RowSlice(0, total, total)


class MergedLinear(Linear):
    def __init__(self, in_features: int, shards: dict[str, int | RowSlice], bias: bool,
                 kernels: KernelConfig = DEFAULT_KERNELS) -> None:
        """shards: each checkpoint tensor's rows in this layer, in order (a count: all of its rows)."""
        slices = {name: s if isinstance(s, RowSlice) else RowSlice.whole(s) for name, s in shards.items()}
        super().__init__(in_features, sum(s.size for s in slices.values()), bias, kernels)
        self.shard_slices = slices
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, rows in slices.items():
            self.shard_offsets[name] = (start, rows.size)
            start += rows.size
        self.weight.weight_loader = self._load_shard  # type: ignore[attr-defined]
        if bias:
            self.bias.weight_loader = self._load_shard  # type: ignore[attr-defined]

    def _load_shard(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str) -> None:
        start, size = self.shard_offsets[shard]
        rows = self.shard_slices[shard]
        if loaded.shape[0] != rows.total:
            raise ValueError(f"shard {shard!r} has {loaded.shape[0]} rows, expected {rows.total}")
        param.data[start : start + size].copy_(loaded.read_rows(rows.start, rows.size))
