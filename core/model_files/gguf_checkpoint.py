"""GGUF file -> checkpoint directory, converted once and kept in the cache.

The directory is keyed by the file's sha256 and the dtype the weights were dequantized to (the
serving dtype), so the same file served on CPU (float32) and on a GPU (bfloat16) gets one copy each,
and a changed file gets a new one. Weights are written in shards of about 2 GiB, so a large
model is never held whole in memory twice.
"""

import json
import logging
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from core.model_files.cache import building, file_sha256
from core.model_files.gguf_config import hf_config
from core.model_files.gguf_reader import open_gguf, read_metadata
from core.model_files.gguf_tokenizer import end_of_generation_ids, gguf_tokenizer
from core.model_files.gguf_weights import iter_hf_tensors

logger = logging.getLogger(__name__)

SHARD_BYTES = 2 << 30


def gguf_checkpoint(gguf_path: Path, cache_dir: Path, dtype: str, sha256: str | None = None,
                    with_tokenizer: bool = True) -> Path:
    """The converted checkpoint directory of `gguf_path`, converting it first if the cache lacks it.
    `sha256`: the file's, when the caller already knows it (a pinned download); else computed."""
    digest = sha256 or file_sha256(gguf_path)
    target = cache_dir / "gguf" / f"{digest[:16]}-{dtype}"
    if (target / "config.json").is_file():
        logger.info("loading %s converted earlier (%s)", gguf_path.name, target)
        return target
    start = time.perf_counter()
    with building(target) as scratch:
        convert_gguf(gguf_path, scratch, dtype, with_tokenizer)
    logger.info("converted %s to %s in %.1f s", gguf_path.name, target, time.perf_counter() - start)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str, with_tokenizer: bool = True) -> None:
    """Writes config.json, generation_config.json, safetensors and (unless told not to) the tokenizer."""
    logger.info("reading %s", gguf_path)
    reader = open_gguf(gguf_path)
    metadata = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    embedding_rows = next(int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight")
    config = hf_config(metadata, names, embedding_rows, dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"eos_token_id": end_of_generation_ids(metadata), "bos_token_id": config["bos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=1))
    if with_tokenizer:
        gguf_tokenizer(metadata, gguf_path).save_pretrained(out_dir)
    tensors = tqdm(iter_hf_tensors(reader, config, getattr(torch, dtype)), total=len(reader.tensors),
                   desc=f"converting {gguf_path.name}", unit="tensor", disable=None)
    _write_shards(tensors, out_dir)


def _write_shards(tensors: "tqdm[tuple[str, torch.Tensor]]", out_dir: Path) -> None:
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    size, number = 0, 1
    for name, tensor in tensors:
        if shard and size + tensor.nbytes > SHARD_BYTES:
            _save_shard(shard, out_dir, number)
            shard, size, number = {}, 0, number + 1
        shard[name] = tensor
        size += tensor.nbytes
        weight_map[name] = _shard_name(number)
    _save_shard(shard, out_dir, number)
    if number == 1:  # transformers looks for exactly this name when there is no index
        (out_dir / _shard_name(1)).rename(out_dir / "model.safetensors")
    else:  # an index tells the loaders which shard holds what
        (out_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _shard_name(number: int) -> str:
    return f"model-{number:05d}.safetensors"


def _save_shard(shard: dict[str, torch.Tensor], out_dir: Path, number: int) -> None:
    save_file(shard, str(out_dir / _shard_name(number)), metadata={"format": "pt"})
