"""FP8 weights (float8_e4m3fn) with float32 scales: `quant_method: fp8` checkpoints (DeepSeek's and Qwen's 128x128
blocks with `weight_scale_inv`, or one `weight_scale` per tensor) and compressed-tensors' `float-quantized` ones
(a `weight_scale` per output channel, per tensor or per block).

Stored: the checkpoint's FP8 weight [out, in] as it is, and its scales as one float32 per block of `scale_block`
(rows, columns) weights: a block format's own blocks, or one scale per row, (1, in), for per-channel and per-tensor
checkpoints (a merged q/k/v holds three tensors' scales, so a per-tensor scale fills its shard's rows). The weight is
w[n, k] = fp8[n, k] * scale[n // rows, k // columns].

On a GPU activations are quantized to FP8 on the fly, dynamically or with the checkpoint's static `input_scale` (the
largest of a merged layer's shards', as vLLM takes it), and the product runs on FP8 tensor cores: up to
gpu/kernels/quant_gemm_configs.py's FP8_CUBLAS_MIN_ROWS rows in gpu/kernels/fp8_gemm.py (activations quantized per
token group of the block's columns inside its loop, 128 columns for per-row weights), from there in cuBLAS
(torch._scaled_mm, activations quantized per token group of 128 for 128x128 blocks, per token for per-row weights,
by gpu/kernels/fp8_quant.py) where its layout rules allow; there a layer whose input is a norm's or a gated
activation's output takes it quantized from that kernel (`apply_normed`, `apply_activated`). At the few rows
gpu/kernels/quant_gemm_configs.py sends to its GEMV path (gpu/kernels/quant_gemv.py) the weights are dequantized in
registers instead and activations stay in bf16, as weight-only FP8 kernels run (vLLM's Marlin FP8): where the weight
stream bounds the product, quantizing x saves nothing, and a static activation scale plays no part there. On a CPU
the dequantized weight runs (gpu/quant/method.py).
"""

from typing import TYPE_CHECKING

import torch
from torch import nn

from gpu.loader import CheckpointTensor
from gpu.quant.layout import PLAIN, TensorLayout, WeightLayout
from gpu.quant.method import ExpertsQuantMethod, QuantMethod

if TYPE_CHECKING:
    from gpu.layers.activation import GatedActivation
    from gpu.layers.norm import NormInput

FP8_DTYPE = torch.float8_e4m3fn
INPUT_SCALE = "input_scale"


class Fp8Method(QuantMethod):
    format_name = "fp8"

    def __init__(self, layout: WeightLayout, scale_name: str, block: tuple[int, int] | None,
                 has_input_scale: bool) -> None:
        """scale_name: the checkpoint's name of the weight scales; block: their (rows, columns) block, None for one
        scale per channel or per tensor; has_input_scale: the checkpoint states a static activation scale."""
        super().__init__(layout)
        self.scale_name = scale_name
        self.scale_block = block or (1, layout.in_features)
        self.has_input_scale = has_input_scale
        if block is not None:
            _check_shards_on_blocks(layout, block[0])

    def create_params(self, device: torch.device) -> dict[str, torch.Tensor]:
        out, cols = self.layout.out_features, self.layout.in_features
        rows_per, cols_per = self.scale_block
        params = {"weight": torch.empty(out, cols, dtype=FP8_DTYPE, device=device),
                  self.scale_name: torch.empty(-(-out // rows_per), -(-cols // cols_per), device=device)}
        if self.has_input_scale:
            params[INPUT_SCALE] = torch.zeros(1, device=device)
        return params

    def tensor_layout(self, name: str) -> TensorLayout:
        if name == self.scale_name:
            rows_per, cols_per = self.scale_block
            is_per_row = cols_per == self.layout.in_features
            return TensorLayout(0, None if is_per_row else 1, (rows_per, 1), (cols_per, 1))
        return PLAIN

    def load(self, layer: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: str | None) -> None:
        if name == INPUT_SCALE:  # one for the layer: the largest of its shards'
            torch.maximum(param.data, loaded.read().float().view(1).to(param.device), out=param.data)
        elif name == self.scale_name and _numel(loaded.shape) == 1 and param.shape[0] > 1:
            for layer_shard, rows in self.layout.checkpoint_rows(shard):  # a per-tensor scale on its rows
                start = self.layout.shard_start(layer_shard)
                param.data[start : start + rows.size] = loaded.read().float().view(1, 1)
        else:
            super().load(layer, name, param, loaded, shard)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        input_scale = self._input_scale(layer)
        if self._runs_on_cublas(rows):
            y = self.cublas_product(layer, rows, input_scale, bias)
        else:
            from gpu.kernels.fp8_gemm import fp8_gemm

            y = fp8_gemm(rows, layer.weight, getattr(layer, self.scale_name), self.scale_block, input_scale, bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _runs_on_cublas(self, rows: torch.Tensor) -> bool:
        """Many rows on a GPU, in a layout cuBLAS's FP8 GEMM takes (16-aligned sizes; 128x128 weight blocks with
        dynamic activations, or a scale per row)."""
        from gpu.kernels.quant_gemm_configs import FP8_CUBLAS_MIN_ROWS

        n, k = self.layout.out_features, self.layout.in_features
        # cuBLAS reads block scales with a 16-byte aligned leading dimension: the weight's K / 128 scales a row, whole
        # sets of 4 (torch passes the stored row length as that dimension)
        is_deepseek_blocks = self.scale_block == (128, 128) and not self.has_input_scale and k % (128 * 4) == 0
        return (rows.is_cuda and rows.shape[0] >= FP8_CUBLAS_MIN_ROWS and n % 16 == 0 and k % 16 == 0
                and rows.stride(-1) == 1 and (self.scale_block[1] >= k or is_deepseek_blocks))

    def cublas_product(self, layer: nn.Module, rows: torch.Tensor, input_scale: torch.Tensor | None,
                       bias: torch.Tensor | None) -> torch.Tensor:
        """torch._scaled_mm: activations quantized per token (per-row weights) or per token group of 128 columns
        (cuBLAS's 1x128 x 128x128 block recipe) first, by one kernel."""
        from gpu.kernels.fp8_quant import quantize_rows

        quantized, x_scales = quantize_rows(rows, self._activation_group(), input_scale)
        return self._scaled_mm(layer, quantized, x_scales, bias, rows)

    def apply_normed(self, layer: nn.Module, inp: "NormInput",
                     bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """On cuBLAS's rows, the norm's kernel writes its output as FP8 and its scales (gpu/kernels/fp8_quant.py):
        what `cublas_product` would quantize, bit for bit, one launch and one 16-bit round trip less."""
        from gpu.kernels.rms_norm import MAX_HIDDEN

        x = inp.x
        if not (x.dim() == 2 and x.shape[1] <= MAX_HIDDEN and inp.norm.is_fused(x) and self._runs_on_cublas(x)):
            return None
        from gpu.kernels.fp8_quant import rms_norm_quantized

        convention = inp.norm.convention
        quantized, x_scales, summed = rms_norm_quantized(
            x, inp.norm.weight, inp.norm.eps, inp.residual, self._activation_group(), self._input_scale(layer),
            convention.weight_offset, convention.scales_in_float32)
        return self._scaled_mm(layer, quantized, x_scales, bias, x), summed

    def apply_activated(self, layer: nn.Module, gate_up: torch.Tensor, act: "GatedActivation",
                        bias: torch.Tensor | None) -> torch.Tensor | None:
        """As `apply_normed`, for the gated activation before a down projection."""
        if not (act.is_fused(gate_up) and self._runs_on_cublas(gate_up)):
            return None
        from gpu.kernels.fp8_quant import gated_activation_quantized

        quantized, x_scales = gated_activation_quantized(gate_up, act.activation, self._activation_group(),
                                                         self._input_scale(layer))
        return self._scaled_mm(layer, quantized, x_scales, bias, gate_up)

    def _activation_group(self) -> int | None:
        """The activations' scales for cuBLAS: per token (None) for per-row weights, per 128 columns for blocks."""
        return None if self.scale_block[1] >= self.layout.in_features else 128

    def _input_scale(self, layer: nn.Module) -> torch.Tensor | None:
        return getattr(layer, INPUT_SCALE) if self.has_input_scale else None

    def _scaled_mm(self, layer: nn.Module, quantized: torch.Tensor, x_scales: torch.Tensor,
                   bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        y = torch._scaled_mm(quantized, layer.weight.t(), scale_a=x_scales,
                             scale_b=getattr(layer, self.scale_name).t(), bias=bias, out_dtype=x.dtype)
        return y[: x.shape[0]]  # grouped activations come padded to whole sets of rows

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return dequantize_blocks(layer.weight, getattr(layer, self.scale_name), self.scale_block)


def dequantize_blocks(weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight [out, in] * scales [ceil(out / rows), ceil(in / columns)] per block, in float32."""
    out, cols = weight.shape
    expanded = scales.float().repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * expanded


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _check_shards_on_blocks(layout: WeightLayout, block_rows: int) -> None:
    """A merged layer's shards must start on block rows: each shard's scales are its own blocks."""
    starts = [layout.shard_start(shard) for shard in layout.shards]
    if any(start % block_rows for start in starts):
        raise ValueError(f"the layer's shards {list(layout.shards)} start at rows {starts}, which do not all fall on "
                         f"the FP8 scale blocks of {block_rows} rows")


class Fp8Scheme:
    """`quant_method: fp8` from config.json (DeepSeek's and Qwen's FP8 checkpoints)."""

    def __init__(self, config: dict[str, object]) -> None:
        if config.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"fp8 format {config['fmt']!r} is not supported (only e4m3)")
        block = config.get("weight_block_size")
        self.block = (int(block[0]), int(block[1])) if block else None  # type: ignore[index]
        self.is_static = config.get("activation_scheme", "dynamic") == "static"
        if self.is_static and self.block:
            raise ValueError("fp8 checkpoints with block scales and static activation scales are not supported")
        self.ignored = list(config.get("ignored_layers") or config.get("modules_to_not_convert") or [])  # type: ignore[call-overload]
        scales = f"{self.block[0]}x{self.block[1]} blocks" if self.block else "a scale per tensor"
        self.description = f"fp8 e4m3 ({scales}, {'static' if self.is_static else 'dynamic'} activation scales)"

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        from gpu.quant.method import matches_any

        if matches_any(checkpoint_names, self.ignored):
            return None
        scale_name = "weight_scale_inv" if self.block else "weight_scale"
        return Fp8Method(layout, scale_name, self.block, self.is_static)

    def experts_method_for(self, module_name: str, experts: nn.Module) -> ExpertsQuantMethod | None:
        """Block-scaled experts, one tensor per expert (gpu/quant/fp8_experts.py); other FP8 experts are refused."""
        from gpu.quant.fp8_experts import Fp8BlockExpertsMethod
        from gpu.quant.method import matches_any

        if matches_any([module_name], self.ignored):
            return None
        if self.block is None or experts.spec.is_gpt_oss_layout:
            raise ValueError(f"{module_name}: FP8 experts are supported with block scales (weight_block_size), one "
                             f"tensor per expert, only; this checkpoint's are {self.description}")
        return Fp8BlockExpertsMethod(self.block)
