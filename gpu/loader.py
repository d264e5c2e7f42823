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
own prefix, Mixtral's `block_sparse_moe`) and leave some out (a vision tower, GLM's multi-token-prediction layers):
the loader logs how many it left, and still requires every parameter of the model but those marked `is_optional` (an
FP8 KV cache's scales, 1 where a checkpoint has none). A mixture of experts' per-expert tensors
(`...experts.<e>.<name>.weight`, by the model's `expert_parts`) go into its stacked expert parameters as
`ExpertShard`s (gpu/layers/moe.py).
"""

import json
import logging
import re
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpertShard:
    """One expert's checkpoint tensor in a stacked parameter: `part` (gate, up, down) of expert `expert`."""

    part: str
    expert: int

class TensorSlice:
    """A tensor in memory, read as safetensors' slice of a file is: a layer's weight loaders take weights no file
    holds (random benchmark weights, tests) through the same `CheckpointTensor`."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, index: object) -> torch.Tensor:
        return self.tensor[index]  # type: ignore[index]


class CheckpointTensor:
    """One tensor of a safetensors file, read whole or as a range of rows or columns."""

    def __init__(self, name: str, file_slice: object) -> None:
        self.name = name
        self._slice = file_slice  # safetensors' PySafeSlice: reads only the bytes it is indexed with
        self.shape: tuple[int, ...] = tuple(file_slice.get_shape())  # type: ignore[attr-defined]

    def read(self) -> torch.Tensor:
        return self._slice[...]  # type: ignore[index]

    def read_rows(self, start: int, size: int) -> torch.Tensor:
        self._check_range(0, start, size)
        return self._slice[start : start + size]  # type: ignore[index]

    def read_columns(self, start: int, size: int) -> torch.Tensor:
        return self.read_slice(1, start, size)

    def read_slice(self, dim: int, start: int, size: int) -> torch.Tensor:
        """Indices [start, start + size) along `dim`, all of the others."""
        self._check_range(dim, start, size)
        index = (slice(None),) * dim + (slice(start, start + size),)
        return self._slice[index]  # type: ignore[index]

    def read_ranges(self, ranges: dict[int, tuple[int, int]]) -> torch.Tensor:
        """Indices [start, start + size) along each dimension named in `ranges`, all of the others."""
        for dim, (start, size) in ranges.items():
            self._check_range(dim, start, size)
        index = tuple(slice(ranges[d][0], sum(ranges[d])) if d in ranges else slice(None)
                      for d in range(len(self.shape)))
        return self._slice[index]  # type: ignore[index]

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


def has_tensors_named(model_dir: Path, prefix: str) -> bool:
    """Whether some checkpoint tensor's name starts with `prefix` (names only: nothing is read)."""
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            if any(name.startswith(prefix) for name in f.keys()):  # noqa: SIM118 - safe_open is not a mapping
                return True
    return False


def iter_checkpoint(model_dir: Path) -> Iterator[CheckpointTensor]:
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield CheckpointTensor(name, f.get_slice(name))


def load_weights(model: nn.Module, model_dir: Path) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    is_tied = bool(getattr(model.config, "tie_word_embeddings", False))
    rename = getattr(model, "checkpoint_name", None)
    loaded: dict[str, set[Hashable | None]] = {}
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
        target, shard = _target(name, model)
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
    missing = [name for name, param in model.named_parameters()
               if loaded.get(name) != _expected_shards(param) and not getattr(param, "is_optional", False)]
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} parameters (or shards of them), e.g. {missing[:3]}")


def _num_tensors(model_dir: Path) -> int:
    total = 0
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            total += len(f.keys())
    return total


def _expected_shards(param: nn.Parameter) -> set[Hashable | None]:
    owner = getattr(getattr(param, "weight_loader", None), "__self__", None)
    if hasattr(owner, "expected_shards"):
        return owner.expected_shards(param)
    shards = getattr(owner, "shard_offsets", None)
    return set(shards) if shards else {None}


def _target(name: str, model: nn.Module) -> tuple[str, Hashable | None]:
    """The parameter a checkpoint tensor goes to, and the shard of it the tensor is."""
    target = expert_target(name, getattr(model, "expert_parts", {}))
    if target is not None:
        return target
    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    for checkpoint_part, (merged_part, shard) in packed.items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{merged_part}."), shard
    return name, None


EXPERT_TENSOR = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<name>\w+)\.(?P<tensor>weight\w*)$")
# The stacked parameters of gpu/layers/moe.py's Experts each part goes into.
EXPERT_PARAMS = {"gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj"}


def expert_target(name: str, parts: dict[str, str]) -> tuple[str, ExpertShard] | None:
    """(parameter, shard) of a per-expert checkpoint tensor, e.g. `...mlp.experts.3.gate_proj.weight` with parts
    {"gate_proj": "gate", ...} -> (`...mlp.experts.gate_up_proj`, ExpertShard("gate", 3)); None for another. A
    quantized format's other tensors keep their suffix: `...experts.3.gate_proj.weight_scale_inv` ->
    `...experts.gate_up_proj_scale_inv`."""
    match = EXPERT_TENSOR.match(name)
    if match is None or match["name"] not in parts:
        return None
    part = parts[match["name"]]
    suffix = match["tensor"].removeprefix("weight")
    return f"{match['prefix']}.{EXPERT_PARAMS[part]}{suffix}", ExpertShard(part, int(match["expert"]))
