"""GPTQ checkpoints (`quant_method: gptq`): int4 or int8 weights packed along the input columns.

Checkpoint tensors of a linear layer [out, in], groups of `group_size` columns (-1: one group per row):
- `qweight` int32 [in * bits / 32, out]: column k of row n at bits (k % per_word) * bits of word [k // per_word, n];
- `qzeros` int32 [groups, out * bits / 32]: zero points packed along the rows the same way;
- `scales` [groups, out] float16;
- `g_idx` int32 [in]: column k's group (by activation order with `desc_act`, else k // group_size).
The weight is (level - zero) * scale. GPTQ's original format (`checkpoint_format: gptq`, the default) stores each
zero point minus one, so the zero is the stored value + 1 (a zero of 0 was stored as -1 and reads as 2^bits, as
GPTQ's own kernels read it); `gptq_v2` stores it as it is.
"""

import torch
from torch import nn

from gpu.quant.int_weights import IntGroups, IntGroupsMethod, unpack_columns
from gpu.quant.layout import TensorLayout, WeightLayout
from gpu.quant.method import QuantMethod, matches_any


class GptqMethod(IntGroupsMethod):
    format_name = "gptq"

    def __init__(self, layout: WeightLayout, bits: int, group_size: int | None, has_act_order: bool,
                 zero_offset: int) -> None:
        super().__init__(layout, bits, group_size, has_act_order)
        self.zero_offset = zero_offset

    def create_params(self, device: torch.device) -> dict[str, torch.Tensor]:
        out, cols, per_word, groups = self.packed_sizes()
        return {"qweight": torch.empty(cols // per_word, out, dtype=torch.int32, device=device),
                "qzeros": torch.empty(groups, out // per_word, dtype=torch.int32, device=device),
                "scales": torch.empty(groups, out, dtype=torch.float16, device=device),
                "g_idx": torch.empty(cols, dtype=torch.int32, device=device)}

    def tensor_layout(self, name: str) -> TensorLayout:
        per_word = 32 // self.bits
        group_columns = None if self.has_act_order or self.group_size is None else 0  # whole: see num_groups
        return {"qweight": TensorLayout(1, 0, (1, 1), (per_word, 1)),
                "qzeros": TensorLayout(1, group_columns, (per_word, 1), (self.local_group_size(), 1)),
                "scales": TensorLayout(1, group_columns, (1, 1), (self.local_group_size(), 1)),
                "g_idx": TensorLayout(None, 0)}[name]

    def int_groups(self, layer: nn.Module) -> IntGroups:
        levels = unpack_columns(layer.qweight.t().contiguous(), self.bits)  # [out, in]
        zeros = unpack_columns(layer.qzeros, self.bits) + self.zero_offset  # 1..16 for int4 in the original format
        group_ids = layer.g_idx.to(torch.int32) if self.has_act_order else None
        scales = layer.scales.t()
        return IntGroups(self.bits, levels, scales, zeros.t().to(scales.dtype), group_ids)


class GptqScheme:
    def __init__(self, config: dict[str, object]) -> None:
        self.bits = int(config.get("bits", 4))  # type: ignore[call-overload]
        group_size = int(config.get("group_size", 128))  # type: ignore[call-overload]
        self.group_size = None if group_size == -1 else group_size
        self.has_act_order = bool(config.get("desc_act", False))
        checkpoint_format = config.get("checkpoint_format", "gptq")
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"gptq checkpoint_format {checkpoint_format!r} is not supported (gptq, gptq_v2)")
        self.zero_offset = 1 if checkpoint_format == "gptq" else 0
        self.ignored = list(config.get("modules_to_not_convert") or [])  # type: ignore[call-overload]
        groups = f"groups of {group_size}" if self.group_size else "per channel"
        self.description = f"gptq int{self.bits} ({groups}{', activation order' if self.has_act_order else ''})"

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        if matches_any(checkpoint_names, self.ignored):
            return None
        return GptqMethod(layout, self.bits, self.group_size, self.has_act_order, self.zero_offset)
