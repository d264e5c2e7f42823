"""compressed-tensors checkpoints (`quant_method: compressed-tensors`, as llm-compressor writes them): the config's
schemes are parsed with the `compressed-tensors` package's own models.

Formats served:
- `float-quantized`: FP8 weights with a `weight_scale` per channel, per tensor or per block, and dynamic (per token)
  or static (`input_scale`) FP8 activations: gpu/quant/fp8.py's method;
- `pack-quantized`: int4 or int8 weights (W4A16, W8A16) with bf16/fp16 activations, in the stored form of
  gpu/quant/int_weights.py. Tensors: `weight_packed` int32 [out, in * bits / 32] (levels + 2^(bits - 1), packed
  from the low bits along the columns), `weight_scale` [out, groups] (groups of `group_size` columns, or one per
  channel), `weight_zero_point` int32 [out * bits / 32, groups] (asymmetric schemes: the zero points + 2^(bits - 1),
  packed along the rows), `weight_g_idx` int32 [in] (`actorder: group`: column k's group), `weight_shape` [2].
  The weight is (level - zero) * scale, zero 0 where the scheme is symmetric.
Layers a scheme targets ("Linear", a module name or a `re:` pattern) and the config's `ignore` does not name are
quantized; the others stay float.
"""

import torch
from torch import nn

from gpu.loader import CheckpointTensor
from gpu.quant.fp8 import Fp8Method
from gpu.quant.int_weights import IntGroups, IntGroupsMethod, unpack_columns
from gpu.quant.layout import TensorLayout, WeightLayout
from gpu.quant.method import QuantMethod, matches_any

SHAPE = "weight_shape"
REMOVED_ACT_ORDERS = ("group", "dynamic", True)  # the package's parser refuses them; their checkpoints are served


class PackedIntMethod(IntGroupsMethod):
    format_name = "compressed-tensors int"

    def create_params(self, device: torch.device) -> dict[str, torch.Tensor]:
        out, cols, per_word, groups = self.packed_sizes()
        params = {"weight_packed": torch.empty(out, cols // per_word, dtype=torch.int32, device=device),
                  "weight_scale": torch.empty(out, groups, device=device),
                  SHAPE: torch.empty(2, dtype=torch.int64, device=device)}
        if self.has_zero_points:
            params["weight_zero_point"] = torch.empty(out // per_word, groups, dtype=torch.int32, device=device)
        if self.has_act_order:
            params["weight_g_idx"] = torch.empty(cols, dtype=torch.int32, device=device)
        return params

    def tensor_layout(self, name: str) -> TensorLayout:
        per_word = 32 // self.bits
        group_columns = None if self.has_act_order or self.group_size is None else 1
        return {"weight_packed": TensorLayout(0, 1, (1, 1), (per_word, 1)),
                "weight_scale": TensorLayout(0, group_columns, (1, 1), (self.local_group_size(), 1)),
                "weight_zero_point": TensorLayout(0, group_columns, (per_word, 1), (self.local_group_size(), 1)),
                "weight_g_idx": TensorLayout(None, 0)}[name]

    def load(self, layer: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: str | None) -> None:
        if name != SHAPE:
            super().load(layer, name, param, loaded, shard)
            return
        expected = [self.layout.checkpoint_rows(shard)[0][1].total, self.layout.columns.total]
        if loaded.read().tolist() != expected:
            raise ValueError(f"{loaded.name} says {loaded.read().tolist()}, the model's layer is {expected}")
        param.data.copy_(torch.tensor([self.layout.out_features, self.layout.in_features]))

    def int_groups(self, layer: nn.Module) -> IntGroups:
        scales = layer.weight_scale
        zeros = None
        if self.has_zero_points:
            zeros = unpack_columns(layer.weight_zero_point.t().contiguous(), self.bits).t().to(scales.dtype)
        group_ids = layer.weight_g_idx.to(torch.int32) if self.has_act_order else None
        return IntGroups(self.bits, unpack_columns(layer.weight_packed, self.bits), scales, zeros, group_ids)


class CompressedTensorsScheme:
    def __init__(self, config: dict[str, object]) -> None:
        from compressed_tensors.quantization import QuantizationConfig

        groups = config.get("config_groups") or {}
        self.act_ordered = {name for name, group in groups.items()  # type: ignore[union-attr]
                            if (group.get("weights") or {}).get("actorder") in REMOVED_ACT_ORDERS}
        parsed = QuantizationConfig.model_validate(_without_removed_act_orders(config))
        self.ignored = list(parsed.ignore or [])
        self.default_format = parsed.format
        self.groups = parsed.config_groups
        self.description = "compressed-tensors " + "; ".join(
            f"{self._format(g)} {_describe(g)}" for g in self.groups.values())  # type: ignore[arg-type]

    def _format(self, group: object) -> str:
        return str(getattr(group, "format", None) or self.default_format)

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        if matches_any(checkpoint_names, self.ignored):
            return None
        for name, group in self.groups.items():
            targets = list(group.targets)  # type: ignore[union-attr]
            if "Linear" in targets or matches_any(checkpoint_names, targets):
                return self._method(name, group, layout)
        return None

    def _method(self, name: str, group: object, layout: WeightLayout) -> QuantMethod:
        weights, inputs, kind = group.weights, group.input_activations, self._format(group)  # type: ignore[attr-defined]
        if kind == "float-quantized" and weights.num_bits == 8 and weights.type == "float":
            block = tuple(weights.block_structure) if weights.strategy == "block" else None
            return Fp8Method(layout, "weight_scale", block, inputs is not None and not inputs.dynamic)  # type: ignore[arg-type]
        if kind == "pack-quantized" and inputs is None and weights.type == "int":
            group_size = weights.group_size if weights.strategy == "group" else None
            return PackedIntMethod(layout, weights.num_bits, group_size, has_act_order=name in self.act_ordered,
                                   has_zero_points=not weights.symmetric)
        raise ValueError(f"compressed-tensors format {kind!r} with {_describe(group)} is not supported; supported: "
                         "float-quantized (FP8 weights and activations), pack-quantized (int4/int8 weights, float "
                         "activations)")


def _describe(group: object) -> str:
    weights, inputs = group.weights, group.input_activations  # type: ignore[attr-defined]
    text = f"weights {weights.type}{weights.num_bits} per {weights.strategy}"
    if weights.strategy == "group":
        text += f" of {weights.group_size}"
    if inputs is not None:
        text += f", activations {inputs.type}{inputs.num_bits} {'dynamic' if inputs.dynamic else 'static'}"
    return text


def _without_removed_act_orders(config: dict[str, object]) -> dict[str, object]:
    """The config with `actorder: group` taken out of its weights (this class keeps which groups had it)."""
    groups = {}
    for name, group in (config.get("config_groups") or {}).items():  # type: ignore[union-attr]
        weights = dict(group.get("weights") or {})
        if weights.get("actorder") in REMOVED_ACT_ORDERS:
            weights.pop("actorder")
        groups[name] = {**group, "weights": weights} if group.get("weights") else group
    return {**config, "config_groups": groups}
