"""MXFP4 experts: `quant_method: mxfp4` checkpoints (gpt-oss's), whose mixtures' experts are stored in the OCP
microscaling format and every other layer in bf16.

Stored per expert weight [rows, columns] as the checkpoint has it: `*_blocks` uint8 [experts, rows, columns / 32, 16],
two 4-bit e2m1 codes a byte (the low nibble first along the columns), and `*_scales` uint8 [experts, rows,
columns / 32], one e8m0 exponent per 32 columns. A weight is w = e2m1(code) * 2^(scale - 127), where an e2m1 code is
a sign bit and three magnitude bits for 0, 0.5, 1, 1.5, 2, 3, 4, 6. gpt-oss's rows are the stacked layout's
outputs: gate_up [experts, 2 * intermediate, hidden] with gate and up interleaved row by row (here de-interleaved at
load: gate rows, then up rows, as the float experts hold them), down [experts, hidden, intermediate]. Under tensor
parallelism a rank reads its gate/up rows and its columns of down, which must fall on the 32-column blocks.

On a CPU the experts are dequantized exactly at load (float32) and run as float ones. On a GPU the stored form stays:
gpu/kernels/fused_moe.py's grouped GEMMs decode each byte's two codes and their block's scale in their loop into the
activation dtype (exact in bfloat16 and float32: a code has two significant bits, a scale is a power of two). With
float16 activations (whose range cannot hold every scale) or the fused kernels off, the experts are dequantized at
load instead, which the log says with the memory it costs.
"""

import logging

import torch
from torch import nn

from gpu.loader import CheckpointTensor
from gpu.quant.layout import WeightLayout
from gpu.quant.method import ExpertsQuantMethod, QuantMethod

logger = logging.getLogger(__name__)

BLOCK = 32  # values per scale
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SCALE_BIAS = 127
PROJECTIONS = ("gate_up_proj", "down_proj")
KERNEL_DTYPES = (torch.bfloat16, torch.float32)  # activation dtypes the GPU kernel decodes into


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks uint8 [..., groups, 16] and scales uint8 [..., groups] -> float32 [..., groups * 32]."""
    magnitudes = torch.tensor(E2M1_MAGNITUDES, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2).long()  # [..., groups, 32]
    values = torch.where(codes >= 8, -magnitudes[codes & 7], magnitudes[codes & 7])
    return torch.ldexp(values, scales.long().unsqueeze(-1) - SCALE_BIAS).flatten(-2)


class Mxfp4ExpertsMethod(ExpertsQuantMethod):
    format_name = "mxfp4"
    description = "mxfp4 (e2m1 with e8m0 scales per 32); on a GPU decoded in the fused MoE kernels' loops"

    def create_params(self, experts: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
        num_experts, hidden, size = experts.spec.routing.num_experts, experts.hidden_size, experts.size
        if hidden % BLOCK or experts.start % BLOCK or size % BLOCK:
            raise ValueError(f"MXFP4 experts need the hidden size ({hidden}) and each rank's share of the intermediate "
                             f"size ({size} from {experts.start}) in whole blocks of {BLOCK}")
        shapes = {"gate_up_proj": (2 * size, hidden), "down_proj": (hidden, size)}
        params = {}
        for name, (rows, columns) in shapes.items():
            params[f"{name}_blocks"] = torch.empty(num_experts, rows, columns // BLOCK, BLOCK // 2, dtype=torch.uint8,
                                                   device=device)
            params[f"{name}_scales"] = torch.empty(num_experts, rows, columns // BLOCK, dtype=torch.uint8,
                                                   device=device)
        return params

    def load(self, experts: nn.Module, name: str, param: nn.Parameter, loaded: CheckpointTensor,
             shard: object) -> None:
        start, size = experts.start, experts.size
        if shard is not None or not experts.spec.is_gpt_oss_layout:
            raise ValueError(f"{loaded.name}: MXFP4 experts are read in gpt-oss's stacked layout only")
        expected = list(param.shape)  # the whole tensor: every rank's rows (gate/up) or blocks of columns (down)
        if name.startswith("gate_up"):
            expected[1] = 2 * experts.spec.intermediate_size
        else:
            expected[2] = experts.spec.intermediate_size // BLOCK
        if loaded.shape != tuple(expected):
            raise ValueError(f"{loaded.name}: checkpoint shape {loaded.shape} != {tuple(expected)}")
        if name.startswith("down"):  # [E, hidden, intermediate / 32 (, 16)]: this rank's blocks of columns
            param.data.copy_(loaded.read_slice(2, start // BLOCK, size // BLOCK))
            return
        rows = loaded.read_slice(1, 2 * start, 2 * size)  # this rank's pairs of interleaved gate and up rows
        param.data.copy_(torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1))

    def finish_loading(self, experts: nn.Module, dtype: torch.dtype) -> None:
        from gpu.kernels import HAS_TRITON

        if next(experts.parameters()).device.type == "cpu":
            return
        if not (experts.kernels.fused_kernels and HAS_TRITON):
            reason = "the fused MoE kernels are off"
        elif dtype not in KERNEL_DTYPES:  # the kernel decodes into the activation dtype, whose range must hold the
            reason = "the MXFP4 kernel decodes into bfloat16 or float32 only"  # scales: float16's does not
        else:
            return
        logger.warning("MXFP4 experts dequantized to %s at load (%s): %.2f GiB instead of %.2f", dtype, reason,
                       self.num_weights(experts) * dtype.itemsize / 2**30, self.stored_bytes(experts) / 2**30)
        gate_up, down = self.dequantize(experts)
        experts.use_float_weights(gate_up.to(dtype), down.to(dtype))

    def stored_bytes(self, experts: nn.Module) -> int:
        return sum(getattr(experts, f"{p}_{kind}").numel() for p in PROJECTIONS for kind in ("blocks", "scales"))

    def __call__(self, experts: nn.Module, x: torch.Tensor, routed: object, add: torch.Tensor | None) -> torch.Tensor:
        """gpu/kernels/fused_moe.py's grouped GEMMs, the weights decoded in their loops."""
        from gpu.kernels.fused_moe import Mxfp4Weights, fused_experts
        from gpu.layers.moe import activation

        gate_up = Mxfp4Weights(experts.gate_up_proj_blocks, experts.gate_up_proj_scales)
        down = Mxfp4Weights(experts.down_proj_blocks, experts.down_proj_scales)
        return fused_experts(x, gate_up, down, routed.weights, routed.expert_ids,  # type: ignore[attr-defined]
                             activation(experts.spec), experts.gate_up_proj_bias, experts.down_proj_bias,
                             use_pdl=True, add=add)

    def dequantize(self, experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(dequantize_mxfp4(getattr(experts, f"{p}_blocks"), getattr(experts, f"{p}_scales"))
                     for p in PROJECTIONS)  # type: ignore[return-value]


class Mxfp4Scheme:
    """`quant_method: mxfp4` from config.json: the experts of every mixture in MXFP4 (the layers the config's
    `modules_to_not_convert` names, and every linear layer, stay float, as transformers reads these checkpoints)."""

    description = "mxfp4 experts (e2m1 in blocks of 32 with e8m0 scales; other layers float)"

    def __init__(self, config: dict[str, object]) -> None:
        self.ignored = list(config.get("modules_to_not_convert") or [])  # type: ignore[call-overload]

    def method_for(self, checkpoint_names: list[str], layout: WeightLayout) -> QuantMethod | None:
        return None

    def experts_method_for(self, module_name: str, experts: nn.Module) -> ExpertsQuantMethod | None:
        from gpu.quant.method import matches_any

        if matches_any([module_name], self.ignored):
            return None
        if not experts.spec.is_gpt_oss_layout:
            raise ValueError(f"{module_name}: MXFP4 experts are supported in gpt-oss's stacked layout only")
        return Mxfp4ExpertsMethod()
