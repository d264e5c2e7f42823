"""Quantized checkpoints for tests, written from a tiny float checkpoint by each format's own rule, each with its
dequantized twin (the same directory's weights as the format defines them, in float32) that transformers loads.

Packing follows each format's specification as written here (compressed-tensors' own `pack_to_int32` and
`quantize` where the package has them); nothing here is read back by our code. Every linear layer of the decoder
blocks is quantized; embeddings, norms and the LM head stay float, as such checkpoints keep them.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max

# A format's writer: (float weight [out, in]) -> (checkpoint tensors by suffix, the weight they dequantize to).
Quantizer = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def write_quantized(source: Path, target: Path, quantizer: Quantizer, quantization_config: dict[str, object]
                    ) -> tuple[Path, Path]:
    """(quantized checkpoint, its dequantized twin) of `source` under `target`."""
    quantized_dir, dequantized_dir = target / "quantized", target / "dequantized"
    for directory in (quantized_dir, dequantized_dir):
        shutil.copytree(source, directory)
    tensors = load_file(str(source / "model.safetensors"))
    quantized, dequantized = {}, {}
    for name, tensor in tensors.items():
        module, _, suffix = name.rpartition(".")
        if suffix == "weight" and module.rpartition(".")[2] in LINEARS:
            parts, weight = quantizer(tensor.float())
            quantized.update({f"{module}.{key}": value.contiguous() for key, value in parts.items()})
            dequantized[name] = weight.float()
        else:
            quantized[name] = dequantized[name] = tensor
    save_file(quantized, str(quantized_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(dequantized, str(dequantized_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((quantized_dir / "config.json").read_text())
    (quantized_dir / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    return quantized_dir, dequantized_dir


def fp8_blocks(block: tuple[int, int]) -> Quantizer:
    """DeepSeek's rule: a scale per block = its largest magnitude / 448, stored as `weight_scale_inv`."""
    def quantize(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rows, cols = weight.shape
        blocks = weight.view(rows // block[0], block[0], cols // block[1], block[1])
        scales = blocks.abs().amax(dim=(1, 3)) / FP8_MAX  # [rows / br, cols / bc]
        levels = (blocks / scales[:, None, :, None]).to(FP8)
        dequantized = (levels.float() * scales[:, None, :, None]).view(rows, cols)
        return {"weight": levels.view(rows, cols), "weight_scale_inv": scales}, dequantized
    return quantize


def fp8_per_tensor(input_scale: float) -> Quantizer:
    """One scale for the tensor, and a static activation scale."""
    def quantize(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        scale = weight.abs().max() / FP8_MAX
        levels = (weight / scale).to(FP8)
        return ({"weight": levels, "weight_scale": scale.reshape(()), "input_scale": torch.tensor(input_scale)},
                levels.float() * scale)
    return quantize


def gptq(bits: int, group_size: int, act_order: bool, seed: int = 0) -> Quantizer:
    """GPTQ's layout (original format: zero points stored minus one), asymmetric min-max per group; with
    `act_order` the columns' groups follow a random permutation, as `desc_act` assigns them."""
    def quantize(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rows, cols = weight.shape
        order = torch.randperm(cols, generator=torch.Generator().manual_seed(seed)) if act_order else torch.arange(cols)
        g_idx = torch.empty(cols, dtype=torch.int32)
        g_idx[order] = (torch.arange(cols) // group_size).to(torch.int32)
        levels, scales, zeros = _affine_groups(weight, g_idx, cols // group_size, bits)  # [rows, cols], [rows, g]
        qweight = _pack_sequential(levels.t(), bits)  # [cols * bits / 32, rows]
        qzeros = _pack_sequential((zeros - 1).t().contiguous(), bits, along_rows=False)  # [groups, rows * bits / 32]
        dequantized = (levels - zeros[:, g_idx.long()]) * scales[:, g_idx.long()].float()
        return {"qweight": qweight, "qzeros": qzeros, "scales": scales.t().contiguous(), "g_idx": g_idx}, dequantized
    return quantize


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def awq(group_size: int) -> Quantizer:
    """AutoAWQ's GEMM layout: 4-bit levels packed along the output rows, row 8j + AWQ_ORDER[i] at bits 4i."""
    def quantize(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rows, cols = weight.shape
        g_idx = (torch.arange(cols) // group_size).to(torch.int32)
        levels, scales, zeros = _affine_groups(weight, g_idx, cols // group_size, 4)
        dequantized = (levels - zeros[:, g_idx.long()]) * scales[:, g_idx.long()].float()
        return {"qweight": _awq_pack(levels.t()), "qzeros": _awq_pack(zeros.t().contiguous()),
                "scales": scales.t().contiguous()}, dequantized
    return quantize


def _awq_pack(values: torch.Tensor) -> torch.Tensor:
    """[n, m] levels -> [n, m / 8] int32, column 8j + AWQ_ORDER[i] at bits 4i of word j."""
    words = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for i, column in enumerate(AWQ_ORDER):
        words |= values[:, column::8].to(torch.int64) << (4 * i)
    return _int32(words)


def _affine_groups(weight: torch.Tensor, g_idx: torch.Tensor, num_groups: int, bits: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min-max asymmetric levels per group (columns by g_idx): (levels [rows, cols] int64, scales [rows, groups]
    float16, zeros [rows, groups] int64 in 1 .. 2^bits - 1, so GPTQ's zero - 1 is never negative)."""
    top = (1 << bits) - 1
    scales = torch.empty(weight.shape[0], num_groups)
    zeros = torch.empty(weight.shape[0], num_groups, dtype=torch.int64)
    for group in range(num_groups):
        columns = weight[:, g_idx == group]
        low, high = columns.amin(1).clamp(max=0), columns.amax(1).clamp(min=0)
        scales[:, group] = ((high - low) / (top - 1)).clamp(min=1e-5)
        zeros[:, group] = (-low / scales[:, group]).round().clamp(1, top).long()
    scales = scales.half()
    levels = (weight / scales[:, g_idx.long()].float()).round() + zeros[:, g_idx.long()]
    return levels.clamp(0, top).long(), scales, zeros


def _pack_sequential(values: torch.Tensor, bits: int, along_rows: bool = True) -> torch.Tensor:
    """Levels packed from the low bits, `32 / bits` consecutive rows (or columns) per int32."""
    per_word = 32 // bits
    if not along_rows:
        return _pack_sequential(values.t(), bits).t().contiguous()
    words = torch.zeros(values.shape[0] // per_word, values.shape[1], dtype=torch.int64)
    for i in range(per_word):
        words |= values[i::per_word].to(torch.int64) << (bits * i)
    return _int32(words)


def _int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def compressed_tensors_config(weights: dict[str, object], inputs: dict[str, object] | None, fmt: str
                              ) -> dict[str, object]:
    group: dict[str, object] = {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "quantization_status": "compressed"}


def ct_packed(bits: int, group_size: int, symmetric: bool, act_order: bool) -> tuple[Quantizer, dict[str, object]]:
    """compressed-tensors' pack-quantized (W4A16/W8A16), quantized and packed with the package's own helpers."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize

    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group_size}
    args = QuantizationArgs(**weights)

    def quantize_weight(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        rows, cols = weight.shape
        generator = torch.Generator().manual_seed(cols)  # the layers of one input (q/k/v) share their order
        g_idx = (torch.randperm(cols, generator=generator) if act_order else torch.arange(cols)) // group_size
        order = torch.argsort(g_idx, stable=True)
        grouped = weight[:, order]  # columns in group order, so the package's contiguous groups apply
        half = 1 << (bits - 1)
        low, high = grouped.view(rows, -1, group_size).amin(-1), grouped.view(rows, -1, group_size).amax(-1)
        if symmetric:
            scale, zero = (torch.maximum(-low, high) / (half - 0.5)).clamp(min=1e-5), torch.zeros_like(low)
        else:
            scale = ((high - low) / (2 * half - 1)).clamp(min=1e-5)
            zero = (-half - low / scale).round().clamp(-half, half - 1)
        scale = scale.to(torch.bfloat16)
        levels = quantize(grouped, scale, zero.to(torch.int8), args, dtype=torch.int8)
        # (level - zero) * scale, exactly: the package's own dequantize rounds the product to the scale's dtype.
        per_column = (levels.float().view(rows, -1, group_size) - zero.unsqueeze(-1)) * scale.float().unsqueeze(-1)
        dequantized = torch.empty_like(weight)
        dequantized[:, order] = per_column.view(rows, cols)
        unordered = torch.empty_like(levels)
        unordered[:, order] = levels
        parts = {"weight_packed": pack_to_int32(unordered, bits), "weight_scale": scale,
                 "weight_shape": torch.tensor([rows, cols])}
        if not symmetric:
            parts["weight_zero_point"] = pack_to_int32(zero.to(torch.int8), bits, packed_dim=0)
        if act_order:
            parts["weight_g_idx"] = g_idx.to(torch.int32)
        return parts, dequantized

    config_weights = {**weights, "actorder": "group"} if act_order else weights
    return quantize_weight, compressed_tensors_config(config_weights, None, "pack-quantized")


def ct_fp8_channel() -> tuple[Quantizer, dict[str, object]]:
    """compressed-tensors' float-quantized FP8: a scale per output channel, dynamic per-token activations."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize

    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
    inputs = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    args = QuantizationArgs(**weights)

    def quantize_weight(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        scale = weight.abs().amax(1, keepdim=True) / FP8_MAX
        levels = quantize(weight, scale, torch.zeros_like(scale), args, dtype=FP8)
        return {"weight": levels, "weight_scale": scale}, levels.float() * scale

    return quantize_weight, compressed_tensors_config(weights, inputs, "float-quantized")


def random_gguf_blocks(rows: int, cols: int, kind: gguf.GGMLQuantizationType, seed: int) -> np.ndarray:
    """Valid blocks of `kind` at random: random bytes, with every fp16 scale set to a small positive value (weights
    about N(0, 0.1) in spread, as a model's)."""
    block, type_size = gguf.constants.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows * cols // block, type_size), dtype=np.uint8)
    offsets = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
    magnitude = {"Q4_0": 0.02, "Q4_1": 0.01, "Q5_0": 0.01, "Q8_0": 0.001, "Q4_K": 0.0005, "Q5_K": 0.0003,
                 "Q6_K": 0.0001}[kind.name]
    for offset in offsets[kind.name]:
        values = rng.uniform(0.5, 1.0, len(data)).astype(np.float16) * np.float16(magnitude)
        data[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, -1)
