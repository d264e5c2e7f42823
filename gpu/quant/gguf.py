"""GGUF weights kept in llama.cpp's blocks (`quant_method: gguf`, written by core/model_files' GGUF conversion).

The checkpoint holds each quantized projection as `qweight` uint8 [out, row bytes] (the file's blocks as they are)
and config.json's `quantization_config.tensor_types` names each one's block type by module, so a layer's parameters
are sized before a tensor is read. A merged layer's shards may differ in type (Q4_K_M files keep some v and down
projections in Q6_K): its `qweight` is the shards' rows one after another, flat. After loading, each run of shards
of one type becomes integer levels with a scale (and an offset) per sub-block (gpu/quant/gguf_blocks.py), the form
the integer-weight kernel reads (gpu/quant/int_weights.py); a product runs one kernel per run, each writing its
columns of the output. 4-bit types keep 4 bits per weight and a scale and offset per 32 in the activation dtype
(Q4_K: 5 bits a weight, the file 4.5); 5- and 6-bit types are held in 8 bits. On a CPU the dequantized weight runs.
"""

from dataclasses import dataclass

import torch
from torch import nn

from gpu.loader import CheckpointTensor
from gpu.quant import gguf_blocks
from gpu.quant.int_weights import IntWeight, to_kernel_form
from gpu.quant.layout import TensorLayout, WeightLayout, read_part
from gpu.quant.method import QuantMethod


@dataclass(frozen=True)
class TypeRun:
    """Consecutive rows of one block type: the layer's rows [row_start, row_start + num_rows), stored at bytes
    [byte_start, byte_start + num_rows * row_bytes) of the flat `qweight`."""

    gguf_type: str
    row_start: int
    num_rows: int
    byte_start: int
    row_bytes: int


class GgufMethod(QuantMethod):
    format_name = "gguf"

    def __init__(self, layout: WeightLayout, shard_types: dict[str | None, str]) -> None:
        super().__init__(layout)
        self.shard_types = shard_types
        self.runs: list[TypeRun] = []
        self.stored: list[IntWeight] = []  # each run's kernel form, after loading
        self.shard_bytes: dict[str | None, int] = {}  # where each shard's rows start in `qweight`
        row = byte = 0
        for shard, rows in layout.shards.items():
            kind, width = shard_types[shard], gguf_blocks.row_bytes(shard_types[shard], layout.in_features)
            self.shard_bytes[shard] = byte
            last = self.runs[-1] if self.runs else None
            if last is not None and last.gguf_type == kind:
                self.runs[-1] = TypeRun(kind, last.row_start, last.num_rows + rows.size, last.byte_start, width)
            else:
                self.runs.append(TypeRun(kind, row, rows.size, byte, width))
            row, byte = row + rows.size, byte + rows.size * width

    def create_params(self, device: torch.device) -> dict[str, torch.Tensor]:
        last = self.runs[-1]
        return {"qweight": torch.empty(last.byte_start + last.num_rows * last.row_bytes, dtype=torch.uint8,
                                       device=device)}

    def load(self, layer: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: str | None) -> None:
        kind, rows = self.shard_types[shard], self.layout.shards[shard]
        block = (gguf_blocks.BLOCK_SIZES[kind], gguf_blocks.TYPE_SIZES[kind])
        if loaded.shape != (rows.total, gguf_blocks.row_bytes(kind, self.layout.columns.total)):
            raise ValueError(f"{loaded.name}: shape {loaded.shape} is not [{rows.total}, row bytes] of {kind}")
        part = read_part(loaded, TensorLayout(0, 1, (1, 1), block), rows, self.layout.columns)
        start = self.shard_bytes[shard]
        param.data[start : start + part.numel()].copy_(part.reshape(-1))

    def finish_loading(self, layer: nn.Module, dtype: torch.dtype) -> None:
        """Each run's blocks as integer levels and per-sub-block scales, the GPU kernel's form."""
        blocks = layer.qweight
        del layer.qweight
        self.stored = []
        for index, run in enumerate(self.runs):
            size = run.num_rows * run.row_bytes
            data = blocks[run.byte_start : run.byte_start + size].view(run.num_rows, run.row_bytes)
            stored = to_kernel_form(gguf_blocks.int_groups(data, run.gguf_type), dtype)
            for name, tensor in stored.tensors().items():
                layer.register_parameter(f"int_{name}_{index}", nn.Parameter(tensor, requires_grad=False))
            self.stored.append(stored)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = torch.empty(rows.shape[0], self.layout.out_features, dtype=x.dtype, device=x.device)
        for run, stored in zip(self.runs, self.stored, strict=True):
            end = run.row_start + run.num_rows
            stored.product(rows, None if bias is None else bias[run.row_start : end], out=y[:, run.row_start : end])
        return y.view(*x.shape[:-1], y.shape[-1])

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return torch.cat([stored.int_groups().dequantize() for stored in self.stored])


class GgufScheme:
    """`quant_method: gguf`: `tensor_types` maps each quantized module's checkpoint name to its block type."""

    def __init__(self, config: dict[str, object]) -> None:
        self.tensor_types: dict[str, str] = dict(config.get("tensor_types") or {})  # type: ignore[call-overload]
        unknown = sorted(set(self.tensor_types.values()) - set(gguf_blocks.TYPES))
        if unknown:
            raise ValueError(f"GGUF block types {unknown} are not supported; supported: {list(gguf_blocks.TYPES)}")
        kinds = list(self.tensor_types.values())
        self.description = "gguf (" + ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds))) + " projections)"

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        types = [self.tensor_types.get(name) for name in checkpoint_names]
        if all(t is None for t in types):
            return None
        if any(t is None for t in types):
            raise ValueError(f"GGUF keeps some of {checkpoint_names} quantized and not others, which are merged here")
        return GgufMethod(layout, dict(zip(layout.shards, types, strict=True)))  # type: ignore[arg-type]
