"""Load a Hugging Face checkpoint directory's safetensors into one of our models.

Single files and sharded checkpoints (with `model.safetensors.index.json`) both work. Every
parameter must be loaded exactly from the checkpoint: a missing or unknown tensor is an error,
never silently left random.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


def iter_checkpoint(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def load_weights(model: nn.Module, model_dir: Path) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    is_tied = bool(getattr(model.config, "tie_word_embeddings", False))
    loaded: dict[str, set[str | None]] = {}
    tensors = tqdm(iter_checkpoint(model_dir), total=_num_tensors(model_dir), desc="loading weights", unit="tensor",
                   disable=None)  # None: a bar on a terminal only, not in logs
    for name, tensor in tensors:
        if name.endswith("rotary_emb.inv_freq") or (is_tied and name == "lm_head.weight"):
            continue
        target, shard = _target(name, packed)
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
        param = params[target]
        with torch.no_grad():
            if shard is None:
                if param.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                param.data.copy_(tensor)
            else:
                param.weight_loader(param, tensor, shard)  # type: ignore[attr-defined]
        loaded.setdefault(target, set()).add(shard)
    missing = [name for name, param in model.named_parameters() if loaded.get(name) != _expected_shards(param)]
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} parameters (or shards of them), e.g. {missing[:3]}")


def _num_tensors(model_dir: Path) -> int:
    total = 0
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            total += len(f.keys())
    return total


def _expected_shards(param: nn.Parameter) -> set[str | None]:
    loader = getattr(param, "weight_loader", None)
    return set(loader.__self__.shard_offsets) if loader is not None else {None}


def _target(name: str, packed: dict[str, tuple[str, str]]) -> tuple[str, str | None]:
    for checkpoint_part, (merged_part, shard) in packed.items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{merged_part}."), shard
    return name, None
