"""AWQ checkpoints (`quant_method: awq`, `version: gemm`): int4 weights packed along the output rows in AWQ's order.

Checkpoint tensors of a linear layer [out, in], groups of `group_size` input columns:
- `qweight` int32 [in, out / 8]: the levels of rows 8j .. 8j + 7 of column k in word [k, j], row 8j + AWQ_ORDER[i]
  at bits 4i (AWQ interleaves the rows so its kernel unpacks them in pairs);
- `qzeros` int32 [groups, out / 8]: zero points, packed the same way;
- `scales` float16 [groups, out].
The weight is (level - zero) * scale.
"""

import torch
from torch import nn

from gpu.quant.int_weights import IntGroups, IntGroupsMethod, unpack_columns
from gpu.quant.layout import TensorLayout, WeightLayout
from gpu.quant.method import QuantMethod, matches_any

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the row of a word's i-th 4-bit field, within its 8 rows
BITS = 4


class AwqMethod(IntGroupsMethod):
    format_name = "awq"

    def create_params(self, device: torch.device) -> dict[str, torch.Tensor]:
        out, cols = self.layout.out_features, self.layout.in_features
        groups = -(-cols // self.local_group_size())
        return {"qweight": torch.empty(cols, out // 8, dtype=torch.int32, device=device),
                "qzeros": torch.empty(groups, out // 8, dtype=torch.int32, device=device),
                "scales": torch.empty(groups, out, dtype=torch.float16, device=device)}

    def tensor_layout(self, name: str) -> TensorLayout:
        group = (self.local_group_size(), 1)
        return {"qweight": TensorLayout(1, 0, (8, 1)), "qzeros": TensorLayout(1, 0, (8, 1), group),
                "scales": TensorLayout(1, 0, (1, 1), group)}[name]

    def int_groups(self, layer: nn.Module) -> IntGroups:
        levels = awq_unpack(layer.qweight).t()  # [out, in]
        scales = layer.scales.t()
        return IntGroups(BITS, levels, scales, awq_unpack(layer.qzeros).t().to(scales.dtype), None)


def awq_unpack(words: torch.Tensor) -> torch.Tensor:
    """[rows, cols / 8] int32 in AWQ's order -> [rows, cols] levels in column order."""
    fields = unpack_columns(words, BITS).view(words.shape[0], -1, 8)  # field i of each word
    order = torch.tensor(AWQ_ORDER, device=words.device)
    columns = torch.empty_like(fields)
    columns[..., order] = fields  # field i holds column AWQ_ORDER[i]
    return columns.view(words.shape[0], -1)


class AwqScheme:
    def __init__(self, config: dict[str, object]) -> None:
        bits = int(config.get("bits", config.get("w_bit", 4)))  # type: ignore[call-overload]
        version = str(config.get("version", "gemm")).lower()
        if bits != BITS or version != "gemm":
            raise ValueError(f"awq {version} with {bits}-bit weights is not supported (gemm, 4-bit)")
        if not config.get("zero_point", True):
            raise ValueError("awq without zero points is not supported")
        self.group_size = int(config.get("group_size", config.get("q_group_size", 128)))  # type: ignore[call-overload]
        self.ignored = list(config.get("modules_to_not_convert") or [])  # type: ignore[call-overload]
        self.description = f"awq int4 (groups of {self.group_size})"

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        if matches_any(checkpoint_names, self.ignored):
            return None
        return AwqMethod(layout, BITS, self.group_size)
