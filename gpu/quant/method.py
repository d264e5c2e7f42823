"""The seam between a linear layer and its weight's format: `QuantMethod`, and `QuantScheme`, which gives each layer
its method from config.json's `quantization_config`.

A method has three parts. Loading: `create_params` names the layer's parameters as the checkpoint names its tensors
(`weight`, `weight_scale_inv`, `qweight`...) and `load` fills this layer's part of each from a checkpoint tensor
(its shard's rows, its rank's columns); `finish_loading` then turns them into what the kernel reads. Running:
`apply` multiplies on the layer's device. The reference: `dequantize`, the float32 weight [out, in] by the format's
own rule, which the CPU runs (weights dequantized exactly, activations in the serving dtype) and the tests compare
every kernel against. A method keeps its parameters on the layer (so the loader and the memory count see them) and
the layer's shape in its `WeightLayout`; nothing else in the model knows the format.
"""

import re
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from gpu.loader import CheckpointTensor
from gpu.quant.layout import PLAIN, RowSlice, TensorLayout, WeightLayout, read_part, stored_range

if TYPE_CHECKING:
    from gpu.layers.activation import GatedActivation
    from gpu.layers.norm import NormInput


class QuantMethod:
    """One linear layer's quantized weight. Subclasses set `format_name` and override what their format needs."""

    format_name = "float"

    def __init__(self, layout: WeightLayout) -> None:
        self.layout = layout
        self._loaded_whole: set[str] = set()  # tensors that hold no rows, loaded by one of the shards

    def create_params(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Checkpoint tensor name -> this layer's part of it, allocated (the loader fills every one)."""
        raise NotImplementedError

    def tensor_layout(self, name: str) -> TensorLayout:
        """How the stored tensor `name` runs along the weight's rows and columns."""
        return PLAIN

    def load(self, layer: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: str | None) -> None:
        """Copies this layer's part of checkpoint tensor `name` (shard `shard`'s rows; with no shard named on a
        merged layer, every shard's rows of one fused tensor) into `param`."""
        tensor_layout = self.tensor_layout(name)
        for layer_shard, rows in self.layout.checkpoint_rows(shard):
            part = read_part(loaded, tensor_layout, rows, self.layout.columns)
            if tensor_layout.row_dim is None:
                param.data.copy_(part.view(param.shape))
                return
            in_layer = RowSlice(self.layout.shard_start(layer_shard), rows.size, self.layout.out_features)
            start, _ = stored_range(in_layer, tensor_layout.rows_per_unit, f"{loaded.name}: shard {layer_shard}'s rows")
            param.data.narrow(tensor_layout.row_dim, start, part.shape[tensor_layout.row_dim]).copy_(part)

    def finish_loading(self, layer: nn.Module, dtype: torch.dtype) -> None:
        """Turns the loaded parameters into the kernel's form, its float values in `dtype` (the activations')."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W.T (+ bias) over x's last dimension, on the layer's device."""
        raise NotImplementedError

    def apply_normed(self, layer: nn.Module, inp: "NormInput",
                     bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(norm(x + residual) @ W.T (+ bias), x + residual) with the norm computed by the kernel that prepares the
        product's input, or None where the format has no such kernel for these rows (the norm then runs alone)."""
        return None

    def apply_activated(self, layer: nn.Module, gate_up: torch.Tensor, act: "GatedActivation",
                        bias: torch.Tensor | None) -> torch.Tensor | None:
        """act(gate_up) @ W.T (+ bias) likewise, or None."""
        return None

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        """The weight [out, in] in float32 by the format's rule: the reference."""
        raise NotImplementedError

    def stored_bytes(self, layer: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for name, p in layer.named_parameters(recurse=False) if name != "bias")

    def num_weights(self, layer: nn.Module) -> int:
        """The weights the layer holds, whatever it stores: out x in."""
        return self.layout.out_features * self.layout.in_features


class ExpertsQuantMethod:
    """A mixture's stacked experts (gpu/layers/moe.py's `Experts`) in a quantized format: the same three parts as a
    linear layer's method, over every expert at once. Loading: `create_params` names the stored tensors as the
    checkpoint does and `load` fills this rank's share of each. Running: `__call__`, as the experts' float method
    runs (x [tokens, hidden] and the routed experts -> [tokens, hidden]). The reference: `dequantize`, the float32
    `gate_up_proj` [experts, 2 * intermediate, hidden] (gate rows, then up rows) and `down_proj` [experts, hidden,
    intermediate] in the float experts' layout, which the CPU runs."""

    format_name = "float"
    description = "float"  # for the start-up log: the stored form and how a GPU runs it

    def create_params(self, experts: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def load(self, experts: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: object) -> None:
        raise NotImplementedError

    def finish_loading(self, experts: nn.Module, dtype: torch.dtype) -> None:
        """Turns the loaded parameters into the kernel's form on a GPU, for `dtype` activations."""

    def __call__(self, experts: nn.Module, x: torch.Tensor, routed: object, add: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self, experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def num_weights(self, experts: nn.Module) -> int:
        """Every expert's gate, up and down weights."""
        num_experts, hidden, size = experts.spec.routing.num_experts, experts.hidden_size, experts.size
        return 3 * num_experts * hidden * size


class QuantScheme(Protocol):
    """A checkpoint's quantization: which linear layers are quantized, and each one's method. A scheme that
    quantizes a mixture's experts also has `experts_method_for(module_name, experts) -> ExpertsQuantMethod | None`;
    a scheme without it that would quantize the experts is refused at start (gpu/quant/__init__.py)."""

    description: str  # for the start-up log, e.g. "fp8 (weights and activations, 128x128 blocks)"

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        """The method of the layer whose checkpoint tensors are `checkpoint_names` (module names, one per shard),
        or None where the checkpoint keeps that layer unquantized."""
        ...


def matches_any(checkpoint_names: list[str], patterns: list[str]) -> bool:
    """Whether a layer's checkpoint modules are named by `patterns` (names, name suffixes after a dot, or `re:`
    patterns, as compressed-tensors and vLLM write ignore and target lists); a merged layer's shards must agree."""

    def matches(name: str) -> bool:
        return any(re.match(p[3:], name) is not None if p.startswith("re:") else name == p or name.endswith("." + p)
                   for p in patterns)

    flags = {matches(name) for name in checkpoint_names}
    if len(flags) > 1:
        raise ValueError(f"the checkpoint quantizes some of {checkpoint_names} and not others, which are merged here")
    return flags.pop()
