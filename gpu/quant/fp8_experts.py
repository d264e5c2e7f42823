"""FP8 experts with block scales: the mixtures of `quant_method: fp8` checkpoints with `weight_block_size` (Qwen3-MoE's
and DeepSeek's FP8 releases), whose every expert has its own `gate_proj`/`up_proj`/`down_proj` `weight`
(float8_e4m3fn) and `weight_scale_inv` (float32, one per block of (rows, columns) weights).

Stored stacked as the float experts are (gpu/layers/moe.py): `gate_up_proj` [experts, 2 * intermediate, hidden]
(gate rows, then up rows) and `down_proj` [experts, hidden, intermediate] in FP8, and beside each its block scales,
`gate_up_proj_scale_inv` [experts, 2 * intermediate / rows, ceil(hidden / columns)] and `down_proj_scale_inv`
[experts, ceil(hidden / rows), intermediate / columns]. A weight is
w[n, k] = fp8[n, k] * scale[n // rows, k // columns].
Under tensor parallelism each rank's share of the intermediate size must be whole blocks (its gate/up rows and its
down columns each read their own blocks' scales).

On a CPU the experts are dequantized exactly at load (float32) and run as float ones. On a GPU the stored form stays:
gpu/kernels/fused_moe.py's grouped GEMMs read the FP8 weights in the activation dtype (exact: e4m3 values fit bf16)
and scale each K tile's float32 sums by its column's block scale, so no weight is rounded. The activations stay in the
serving dtype (weights-only FP8 on the experts: the checkpoint's dynamic activation quantization is not applied there,
which rounds less, and the products run on bf16 tensor cores, not FP8 ones); the log says so at start.
"""

import logging

import torch
from torch import nn

from gpu.loader import CheckpointTensor, ExpertShard
from gpu.quant.fp8 import FP8_DTYPE, dequantize_blocks
from gpu.quant.method import ExpertsQuantMethod

logger = logging.getLogger(__name__)

PROJECTIONS = ("gate_up_proj", "down_proj")
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Fp8BlockExpertsMethod(ExpertsQuantMethod):
    format_name = "fp8"
    description = ("fp8 e4m3 weights with block scales; on a GPU the activations stay unquantized (weights-only), "
                   "each K tile's sums scaled in the fused MoE kernels")

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block  # (rows, columns) of weights per scale

    def create_params(self, experts: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
        num_experts, hidden = experts.spec.routing.num_experts, experts.hidden_size
        size, start = experts.size, experts.start
        rows, columns = self.block
        if size % rows or start % rows or size % columns or start % columns:
            raise ValueError(f"FP8 experts need each rank's share of the intermediate size ({size} from {start}) in "
                             f"whole scale blocks of {self.block}")
        return {"gate_up_proj": torch.empty(num_experts, 2 * size, hidden, dtype=FP8_DTYPE, device=device),
                "gate_up_proj_scale_inv": torch.empty(num_experts, 2 * size // rows, -(-hidden // columns),
                                                      device=device),
                "down_proj": torch.empty(num_experts, hidden, size, dtype=FP8_DTYPE, device=device),
                "down_proj_scale_inv": torch.empty(num_experts, -(-hidden // rows), size // columns, device=device)}

    def load(self, experts: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: object) -> None:
        if not isinstance(shard, ExpertShard):
            raise ValueError(f"{loaded.name}: FP8 experts are read from one tensor per expert and projection")
        rows, columns = self.block
        is_scale = name.endswith("_scale_inv")
        start, size, total = experts.start, experts.size, experts.spec.intermediate_size
        hidden = experts.hidden_size
        if shard.part == "down":  # [hidden, intermediate]: this rank's columns (of blocks, for the scales)
            unit = columns if is_scale else 1
            expected = (-(-hidden // rows), total // columns) if is_scale else (hidden, total)
            _check_shape(loaded, expected)
            param.data[shard.expert].copy_(loaded.read_slice(1, start // unit, size // unit))
            return
        unit = rows if is_scale else 1  # gate or up [intermediate, hidden]: this rank's rows (of blocks)
        expected = (total // rows, -(-hidden // columns)) if is_scale else (total, hidden)
        _check_shape(loaded, expected)
        offset = 0 if shard.part == "gate" else size // unit
        rows_read = loaded.read_slice(0, start // unit, size // unit)
        param.data[shard.expert, offset : offset + size // unit].copy_(rows_read)

    def finish_loading(self, experts: nn.Module, dtype: torch.dtype) -> None:
        from gpu.kernels import HAS_TRITON

        if next(experts.parameters()).device.type == "cpu":
            return
        if experts.kernels.fused_kernels and HAS_TRITON and dtype in KERNEL_DTYPES:
            return
        logger.warning("FP8 experts dequantized to %s at load (the fused MoE kernels are off): %.2f GiB instead of "
                       "%.2f", dtype, self.num_weights(experts) * dtype.itemsize / 2**30,
                       sum(getattr(experts, n).numel() for n in PROJECTIONS) / 2**30)
        gate_up, down = self.dequantize(experts)
        experts.use_float_weights(gate_up.to(dtype), down.to(dtype))

    def __call__(self, experts: nn.Module, x: torch.Tensor, routed: object, add: torch.Tensor | None) -> torch.Tensor:
        """gpu/kernels/fused_moe.py's grouped GEMMs, each K tile's sums scaled by its block's scale."""
        from gpu.kernels.fused_moe import Fp8BlockWeights, fused_experts
        from gpu.layers.moe import activation

        gate_up = Fp8BlockWeights(experts.gate_up_proj, experts.gate_up_proj_scale_inv, self.block)
        down = Fp8BlockWeights(experts.down_proj, experts.down_proj_scale_inv, self.block)
        return fused_experts(x, gate_up, down, routed.weights, routed.expert_ids,  # type: ignore[attr-defined]
                             activation(experts.spec), experts.gate_up_proj_bias, experts.down_proj_bias,
                             use_pdl=True, add=add)

    def dequantize(self, experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.stack([dequantize_blocks(w, s, self.block) for w, s in
                                  zip(getattr(experts, p), getattr(experts, f"{p}_scale_inv"), strict=True)])
                     for p in PROJECTIONS)  # type: ignore[return-value]


def _check_shape(loaded: CheckpointTensor, expected: tuple[int, ...]) -> None:
    if loaded.shape != expected:
        raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != {expected}")
