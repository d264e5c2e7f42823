"""Linear layers: `Linear`, whose product takes one of four routes, and `MergedLinear`, which stacks several
checkpoint tensors (q/k/v, gate/up) into one weight.

A `Linear`'s product x @ W.T runs on, in this order:
1. its packed weight, on a CPU (the runner packs after loading: gpu/layers/cpu_linear.py); where the integer
   dot-product kernels multiply it, they compute the product's input too (the residual add + RMSNorm before q/k/v
   and gate/up, SiLU-and-mul before down), as the skinny GEMM's prologues do;
2. quack's gated GEMM, for a [gate; up] layer over MIN_ROWS+ rows where the runner's probe found it working:
   SiLU-and-mul in the product's epilogue, so the activation pair leaves the chip once (gpu/kernels/gated_gemm.py);
3. the skinny GEMM kernel, for 1..MAX_ROWS rows in bf16/fp16 on CUDA, where the GPU's table says it beats cuBLAS
   (gpu/kernels/skinny_gemm_configs.py); where the GPU's prologue rule says so, that kernel also computes its own
   input (the residual add + RMSNorm before q/k/v and gate/up, SiLU-and-mul before down): one launch less each
   (Llama's norm convention and SiLU only: Gemma's norms and GELU run on their own first);
4. cuBLAS (F.linear) otherwise, and everywhere when built with `KernelConfig.fused_kernels` off (the reference).
A quantized layer's format takes the product (gpu/quant/); where it has a kernel that prepares the product's input
from the norm or activation before it (FP8's quantization), `forward_normed` and `forward_activated` let it.
The choice depends on shapes, dtypes and the GPU only, so it is the same at every replay of a CUDA graph. The LM
head (gpu/layers/vocab_parallel.py) routes through the same `linear`. `warm_up_skinny_gemm` compiles every row
bucket's config before a request.

Merging turns three (or two) matmuls into one; each parameter of a MergedLinear carries a `weight_loader` that copies
one checkpoint shard into its rows. Under tensor parallelism a MergedLinear is column-parallel: each of its shards
holds a `RowSlice` of its checkpoint tensor (this rank's heads, or its share of the MLP) and reads only those rows.
"""

import torch
import torch.nn.functional as F
from torch import nn

from gpu.config import DEFAULT_KERNELS, KernelConfig
from gpu.kernels import HAS_TRITON, gated_gemm
from gpu.kernels.skinny_gemm_configs import MAX_ROWS, SkinnyConfig, row_bucket
from gpu.layers.activation import GatedActivation, SiluAndMul
from gpu.layers.cpu_linear import CpuPacking, PackedWeight
from gpu.layers.int8_dot_linear import GATED_ACTIVATIONS, Int8DotProduct
from gpu.layers.norm import NormInput
from gpu.loader import CheckpointTensor
from gpu.quant.layout import ColumnSlice, RowSlice, WeightLayout
from gpu.quant.method import QuantMethod

SKINNY_DTYPES = (torch.bfloat16, torch.float16)


class Linear(nn.Linear):
    def __init__(
        self, in_features: int, out_features: int, bias: bool, kernels: KernelConfig = DEFAULT_KERNELS
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels
        self.packed: PackedWeight | None = None
        self.quant: QuantMethod | None = None  # a quantized checkpoint's format (gpu/quant/); None: a float weight

    def weight_layout(self) -> WeightLayout:
        """Where this layer's weight lies in its checkpoint tensors: all of one tensor."""
        return WeightLayout({None: RowSlice.whole(self.out_features)}, ColumnSlice.whole(self.in_features))

    def use_quant_method(self, method: QuantMethod) -> None:
        """Replaces the float weight by the method's parameters, named as the checkpoint names its tensors."""
        device = self.weight.device
        del self.weight
        for name, tensor in method.create_params(device).items():
            param = nn.Parameter(tensor, requires_grad=False)
            param.weight_loader = self._load_quantized  # type: ignore[attr-defined]
            param.quant_name = name  # type: ignore[attr-defined]
            self.register_parameter(name, param)
        self.quant = method

    def _load_quantized(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        assert self.quant is not None
        self.quant.load(self, param.quant_name, param, loaded, shard)  # type: ignore[attr-defined]

    def finish_loading(self, dtype: torch.dtype) -> None:
        """After loading: a quantized weight in its kernel's form on a GPU (for `dtype` activations); on a CPU
        dequantized (the reference: the weights exactly, the activations in the serving dtype), after which the layer
        is a float one."""
        if self.quant is None:
            return
        self.quant.finish_loading(self, dtype)
        if next(self.parameters()).device.type != "cpu":
            return
        weight = self.quant.dequantize(self)
        for name in [n for n in self._parameters if n != "bias"]:
            delattr(self, name)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.quant = None

    def pack_for_cpu(self, packing: CpuPacking) -> str | None:
        """Replaces the weight by its packed form (the weight's memory is freed); returns the form's kind, None
        where the weight stays as it is."""
        self.packed = packing.pack(self.weight.detach())
        if self.packed is None:
            return None
        self.weight = None  # type: ignore[assignment]
        return self.packed.kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(self._product(x))

    def forward_normed(self, inp: NormInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual): in one kernel where `_prologue_config` gives a config."""
        x = inp.x
        if isinstance(self.packed, Int8DotProduct) and self.packed.takes(x, inp.residual, inp.norm.weight, self.bias):
            y, summed = self.packed.normed(x, inp.residual, inp.norm, self.bias)
            return self._reduce(y), summed
        fused = self.quant.apply_normed(self, inp, self.bias) if self.quant is not None else None
        if fused is not None:
            return self._reduce(fused[0]), fused[1]
        is_fusable = x.dim() == 2 and inp.norm.is_fused(x) and inp.norm.is_llama_style  # the prologue's convention
        config = self._prologue_config(x, "norm") if is_fusable else None
        if config is not None:
            from gpu.kernels.skinny_gemm import skinny_gemm_rms_norm

            y, summed = skinny_gemm_rms_norm(x, inp.residual, inp.norm.weight, inp.norm.eps, self.weight, self.bias,
                                             config, use_pdl=True)
            return self._reduce(y), summed
        normed, summed = inp.compute()
        return self._reduce(self._product(normed)), summed

    def forward_activated(self, gate_up: torch.Tensor, act: "GatedActivation") -> torch.Tensor:
        """self(act(gate_up)): in one kernel where `_prologue_config` gives a config, or where the CPU's packed
        weight computes its input (SiLU- or GELU-and-mul)."""
        if (isinstance(self.packed, Int8DotProduct) and act.activation in GATED_ACTIVATIONS
                and self.packed.takes(gate_up, self.bias)):
            return self._reduce(self.packed.gated(gate_up, self.bias, act.activation))
        product = self.quant.apply_activated(self, gate_up, act, self.bias) if self.quant is not None else None
        if product is not None:
            return self._reduce(product)
        is_fusable = isinstance(act, SiluAndMul) and act.is_fused(gate_up)  # the prologue computes SiLU only
        config = self._prologue_config(gate_up[:, : self.in_features], "silu") if is_fusable else None
        if config is not None:
            from gpu.kernels.skinny_gemm import skinny_gemm_silu_and_mul

            return self._reduce(skinny_gemm_silu_and_mul(gate_up, self.weight, self.bias, config, use_pdl=True))
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
        return (self.kernels.fused_kernels and self.packed is None and self.quant is None and self.bias is None
                and x.dim() == 2
                and x.shape[0] >= gated_gemm.MIN_ROWS and x.dtype in gated_gemm.DTYPES and x.dtype == self.weight.dtype
                and x.stride(-1) == 1 and self.weight.is_contiguous() and gated_gemm.is_ready(x.device, x.dtype)
                and not (torch.is_grad_enabled() and self.weight.requires_grad))

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x, self.bias)
        if self.quant is not None:
            return self.quant.apply(self, x, self.bias)
        return linear(x, self.weight, self.bias, self.kernels)

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        """This layer's output from its product (a row-parallel layer sums the ranks' products here)."""
        return y

    def _is_skinny(self, x: torch.Tensor) -> bool:
        return is_skinny(x, self.weight, self.kernels)

    def _prologue_config(self, x: torch.Tensor, kind: str) -> SkinnyConfig | None:
        """The skinny kernel's config for a product over x [M, in_features] that computes its input (a `kind`
        prologue), or None: the elementwise step runs on its own."""
        if self.packed is None and self.quant is None and runs_on_skinny_kernel(x, self.weight, self.kernels):
            from gpu.kernels.skinny_gemm import prologue_config

            return prologue_config(x.shape[0], self.in_features, kind, x.device)
        return None


def runs_on_skinny_kernel(x: torch.Tensor, weight: torch.Tensor, kernels: KernelConfig) -> bool:
    """Whether the skinny GEMM kernel can take x @ weight.T (the GPU's table aside)."""
    num_rows = x.numel() // weight.shape[1]
    return (kernels.fused_kernels and HAS_TRITON and x.is_cuda and x.dtype in SKINNY_DTYPES and x.dtype == weight.dtype
            and 0 < num_rows <= MAX_ROWS and x.stride(-1) == 1 and weight.stride(-1) == 1
            and not (torch.is_grad_enabled() and weight.requires_grad))


def is_skinny(x: torch.Tensor, weight: torch.Tensor, kernels: KernelConfig) -> bool:
    """Whether x @ weight.T runs on the skinny GEMM kernel: route 3 of this module's docstring."""
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

    y = skinny_gemm(x.reshape(-1, weight.shape[1]), weight, bias, use_pdl=True, out=out)
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
                and weight.is_cuda and getattr(layer, "quant", None) is None:  # (a norm's weight is 1-d)
            for rows in buckets:
                linear(torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device), weight, None,
                       kernels)
                calls += 1
    return calls


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

    def weight_layout(self) -> WeightLayout:
        return WeightLayout(dict(self.shard_slices), ColumnSlice.whole(self.in_features))

    def _load_shard(self, param: nn.Parameter, loaded: CheckpointTensor, shard: str | None) -> None:
        """One shard's checkpoint tensor; or, with no shard named, one tensor holding every shard's rows in order
        (a fused checkpoint tensor, e.g. Phi-3's qkv_proj), each shard's rows read from its part of it."""
        if shard is None:
            self._load_fused(param, loaded)
            return
        start, size = self.shard_offsets[shard]
        rows = self.shard_slices[shard]
        if loaded.shape[0] != rows.total:
            raise ValueError(f"shard {shard!r} has {loaded.shape[0]} rows, expected {rows.total}")
        param.data[start : start + size].copy_(loaded.read_rows(rows.start, rows.size))

    def _load_fused(self, param: nn.Parameter, loaded: CheckpointTensor) -> None:
        total = sum(rows.total for rows in self.shard_slices.values())
        if loaded.shape[0] != total:
            parts = ", ".join(self.shard_slices)
            raise ValueError(f"{loaded.name} has {loaded.shape[0]} rows, expected {total} ({parts})")
        part_start = 0
        for name, rows in self.shard_slices.items():
            start, size = self.shard_offsets[name]
            param.data[start : start + size].copy_(loaded.read_rows(part_start + rows.start, rows.size))
            part_start += rows.total
