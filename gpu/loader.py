"""Load a Hugging Face checkpoint directory's safetensors into one of our models.

Single files and sharded checkpoints (with `model.safetensors.index.json`) both work. Every
parameter must be loaded exactly from the checkpoint: a missing or unknown tensor is an error,
never silently left random.

A parameter with a `weight_loader` reads what it needs of a checkpoint tensor itself, through a
`CheckpointTensor`: a tensor-parallel rank reads only its slice's bytes (safetensors' get_slice),
never the whole tensor. Other parameters read the whole tensor, which must have their shape.
A merged parameter (q/k/v, gate/up) takes its checkpoint tensors one shard at a time (`packed_modules`), or
all at once from one fused tensor (Phi-3's `qkv_proj`, `gate_up_proj`).

A model may rename checkpoint tensors (`checkpoint_name`: a multimodal checkpoint's language model under its
own prefix) and leave some out (its vision tower): the loader logs how many it left, and still requires every
parameter of the model.
"""

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

logger = logging.getLogger(__name__)

class CheckpointTensor:
    """One tensor of a safetensors file, read whole or as a range of rows or columns."""

    def __init__(self, name: str, file_slice: object) -> None:
        self.name = name
        self._slice = file_slice  # safetensors' PySafeSlice: reads only the bytes it is indexed with
        self.shape: tuple[int, ...] = tuple(file_slice.get_shape())  # type: ignore[attr-defined]

    def read(self) -> torch.Tensor:
        return self._slice[:]  # type: ignore[index]

    def read_rows(self, start: int, size: int) -> torch.Tensor:
        self._check_range(0, start, size)
        return self._slice[start : start + size]  # type: ignore[index]

    def read_columns(self, start: int, size: int) -> torch.Tensor:
        self._check_range(1, start, size)
        return self._slice[:, start : start + size]  # type: ignore[index]

    def _check_range(self, dim: int, start: int, size: int) -> None:
        if len(self.shape) <= dim or start + size > self.shape[dim]:
            raise ValueError(f"{self.name}: cannot read [{start}, {start + size}) along dimension {dim} "
                             f"of a tensor of shape {self.shape}")


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return files


def iter_checkpoint(model_dir: Path) -> Iterator[CheckpointTensor]:
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield CheckpointTensor(name, f.get_slice(name))


def load_weights(model: nn.Module, model_dir: Path) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    is_tied = bool(getattr(model.config, "tie_word_embeddings", False))
    rename = getattr(model, "checkpoint_name", None)
    loaded: dict[str, set[str | None]] = {}
    left_out: list[str] = []
    tensors = tqdm(iter_checkpoint(model_dir), total=_num_tensors(model_dir), desc="loading weights", unit="tensor",
                   disable=None)  # None: a bar on a terminal only, not in logs
    for tensor in tensors:
        name = rename(tensor.name) if rename is not None else tensor.name
        if name is None:
            left_out.append(tensor.name)
            continue
        if name.endswith("rotary_emb.inv_freq") or (is_tied and name == "lm_head.weight"):
            continue
        target, shard = _target(name, packed)
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
        param = params[target]
        with torch.no_grad():
            if hasattr(param, "weight_loader"):
                param.weight_loader(param, tensor, shard)
            elif shard is not None:
                raise ValueError(f"{name}: {target} takes no shards")
            else:
                if param.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tensor.shape} != {tuple(param.shape)}")
                param.data.copy_(tensor.read())
        loaded.setdefault(target, set()).update(_expected_shards(param) if shard is None else {shard})
    if left_out:
        logger.info("left out %d checkpoint tensors the served model does not use (e.g. %s)", len(left_out),
                    left_out[0])
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
    shards = getattr(getattr(loader, "__self__", None), "shard_offsets", None)
    return set(shards) if shards else {None}


def _target(name: str, packed: dict[str, tuple[str, str]]) -> tuple[str, str | None]:
    for checkpoint_part, (merged_part, shard) in packed.items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{merged_part}."), shard
    return name, None
