"""An FP8 KV cache's reference for tests: transformers with every layer's keys and values rounded as our cache
stores them (fp8(x / scale) * scale, the division in float32, saturated at 448), through an attention function of its
own, and a checkpoint that states per-layer scales (`self_attn.k_scale`, `v_scale`, as llm-compressor writes them)."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "fp8_kv_cache"
_SCALES: dict[str, list[tuple[float, float]]] = {}  # model id -> each layer's (k_scale, v_scale)


def rounded(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x as an FP8 cache holds it (saturated at FP8's largest magnitude) and attention reads it back."""
    return ((x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    k_scale, v_scale = _SCALES[module.config._name_or_path][module.layer_idx]
    return sdpa_attention_forward(module, query, rounded(key, k_scale), rounded(value, v_scale), *args, **kwargs)


AttentionInterface.register(ATTENTION, _attention)
# The masks sdpa takes (a sliding window's too): an attention function with no mask of its name gets another.
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def fp8_kv_model(model_dir: Path, dtype: torch.dtype, device: str = "cpu") -> AutoModelForCausalLM:
    """transformers' model of `model_dir` whose attention reads its keys and values as an FP8 cache would hold them,
    with the checkpoint's scales (1 where it states none)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTENTION).to(device)
    tensors = load_file(str(model_dir / "model.safetensors"))
    _SCALES[model.config._name_or_path] = [
        tuple(float(tensors.get(f"model.layers.{i}.self_attn.{name}", torch.tensor(1.0))) for name in
              ("k_scale", "v_scale")) for i in range(model.config.num_hidden_layers)]  # type: ignore[misc]
    return model.eval()


def with_kv_scales(source: Path, target: Path, scales: list[tuple[float, float]]) -> Path:
    """A copy of checkpoint `source` that states each layer's (k_scale, v_scale)."""
    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    for i, (k_scale, v_scale) in enumerate(scales):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k_scale)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v_scale)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == len(scales)
    return target
