"""gpt-oss checkpoints with MXFP4 experts for tests, written from a tiny float gpt-oss checkpoint by the OCP
microscaling rule, as gpt-oss's release stores them; nothing here is read back by our code.

Each block of 32 values of a row shares the exponent X = floor(log2(max |v|)) - 2 (2: the largest e2m1 exponent),
stored as the byte X + 127; each value is the nearest e2m1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6) to |v| / 2^X with
its sign, clamped at 6, a 4-bit code (sign, then the magnitude's index) packed two a byte, the even column's in the
low nibble. Rows are the projections' outputs: the stacked gate_up [experts, hidden, 2 * intermediate] is stored
transposed, [experts, 2 * intermediate, hidden / 32, 16], down [experts, intermediate, hidden] as [experts, hidden,
intermediate / 32, 16].
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [..., columns] -> (blocks uint8 [..., columns / 32, 16], scales uint8 [..., columns / 32])."""
    groups = weight.float().unflatten(-1, (-1, 32))
    largest = groups.abs().amax(dim=-1).clamp(min=2.0 ** -100)
    exponent = torch.floor(torch.log2(largest)) - 2
    scaled = (groups.abs() / torch.exp2(exponent).unsqueeze(-1)).clamp(max=6.0)
    index = (scaled.unsqueeze(-1) - MAGNITUDES).abs().argmin(dim=-1)
    codes = (index | ((groups < 0).long() << 3)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def write_mxfp4_gpt_oss(source: Path, target: Path) -> Path:
    """`source` (a float gpt-oss checkpoint) with every layer's experts in MXFP4, under `target`."""
    shutil.copytree(source, target)
    tensors = load_file(str(source / "model.safetensors"))
    quantized = {}
    for name, tensor in tensors.items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            blocks, scales = quantize_rows(tensor.transpose(1, 2))
            quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks.contiguous(), scales.contiguous()
        else:
            quantized[name] = tensor
    save_file(quantized, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "quantization_config": MXFP4_CONFIG}))
    return target
