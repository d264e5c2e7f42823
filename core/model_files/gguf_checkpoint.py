"""GGUF file -> checkpoint directory, converted once and kept in the cache.

The directory is keyed by the file's sha256 and the dtype the weights were dequantized to (the
serving dtype), so the same file served on CPU (float32) and on a GPU (bfloat16) gets one copy each,
and a changed file gets a new one. For a GPU (`keep_blocks`) the projections stay in their quantized
blocks and config.json's `quantization_config` names each one's type (gpu/quant/gguf.py), so the GPU
reads the file's bytes, not bfloat16; a CPU gets them dequantized. Weights are written in shards of
about 2 GiB, so a large model is never held whole in memory twice. Sampling values the caller knows
for the model (a GGUF states none) go into its generation_config.json, in a new copy and in one
converted before.
"""

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from core.model_files.cache import building, file_sha256
from core.model_files.gguf_config import hf_config
from core.model_files.gguf_reader import open_gguf, read_metadata
from core.model_files.gguf_tokenizer import end_of_generation_ids, gguf_tokenizer
from core.model_files.gguf_weights import block_types, iter_hf_tensors
from core.sampling_defaults import GENERATION_CONFIG_FILE

logger = logging.getLogger(__name__)

SHARD_BYTES = 2 << 30


def gguf_checkpoint(gguf_path: Path, cache_dir: Path, dtype: str, sha256: str | None = None,
                    with_tokenizer: bool = True, sampling: Mapping[str, float] | None = None,
                    keep_blocks: bool = False) -> Path:
    """The converted checkpoint directory of `gguf_path`, converting it first if the cache lacks it.
    `sha256`: the file's, when the caller already knows it (a pinned download); else computed. `sampling`:
    generation-config values its generation_config.json must state (a model card's recommended ones)."""
    digest = sha256 or file_sha256(gguf_path)
    target = cache_dir / "gguf" / f"{digest[:16]}-{dtype}{'-blocks' if keep_blocks else ''}"
    if (target / "config.json").is_file():
        logger.info("loading %s converted earlier (%s)", gguf_path.name, target)
        if sampling and set_generation_values(target, sampling):
            logger.info("%s now states the model's recommended sampling: %s", target / GENERATION_CONFIG_FILE, sampling)
        return target
    start = time.perf_counter()
    with building(target) as scratch:
        convert_gguf(gguf_path, scratch, dtype, with_tokenizer, keep_blocks)
        if sampling:
            set_generation_values(scratch, sampling)
    logger.info("converted %s to %s in %.1f s", gguf_path.name, target, time.perf_counter() - start)
    return target


def set_generation_values(checkpoint: Path, values: Mapping[str, float]) -> bool:
    """Makes the checkpoint's generation_config.json state `values`, with `do_sample` on as transformers wants
    beside them; returns whether it had to change. The file is replaced whole, never left half-written."""
    path = checkpoint / GENERATION_CONFIG_FILE
    config = json.loads(path.read_text())
    wanted = {"do_sample": True, **values}
    if all(config.get(key) == value for key, value in wanted.items()):
        return False
    scratch = path.with_name(f".{GENERATION_CONFIG_FILE}.{os.getpid()}")
    scratch.write_text(json.dumps(config | wanted, indent=1))
    scratch.replace(path)
    return True


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str, with_tokenizer: bool = True,
                 keep_blocks: bool = False) -> None:
    """Writes config.json, generation_config.json, safetensors and (unless told not to) the tokenizer."""
    logger.info("reading %s", gguf_path)
    reader = open_gguf(gguf_path)
    metadata = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    embedding_rows = next(int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight")
    config = hf_config(metadata, names, embedding_rows, dtype)
    arch = str(metadata["general.architecture"])
    if keep_blocks:
        config["quantization_config"] = {"quant_method": "gguf", "tensor_types": block_types(reader, arch)}
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"eos_token_id": end_of_generation_ids(metadata), "bos_token_id": config["bos_token_id"]}
    (out_dir / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=1))
    if with_tokenizer:
        gguf_tokenizer(metadata, gguf_path).save_pretrained(out_dir)
    tensors = tqdm(iter_hf_tensors(reader, config, arch, getattr(torch, dtype), keep_blocks), total=len(reader.tensors),
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
