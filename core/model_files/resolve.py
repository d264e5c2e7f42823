"""`--model` -> a checkpoint directory: what people have, in the order vLLM looks for it.

1. nothing: the default model (SmolLM2-135M-Instruct); when it cannot be had, the built-in tiny
   random model, with a warning that its output is gibberish;
2. a built-in name: `smollm2-135m-instruct` or `gemma-3-270m` (real models from the package index), or `tiny`
   (the tiny random model, for tests);
3. an existing path: a checkpoint directory, a .gguf file, or a directory holding one .gguf;
4. something path-like that does not exist: an error saying so;
5. anything else: a Hugging Face Hub id, downloaded with huggingface_hub where the network allows.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from core.config import EngineConfig
from core.model_files import default_model
from core.model_files.cache import DEFAULT_CACHE_DIR, cache_dir_for
from core.model_files.errors import ModelNotFound, ModelUnavailable
from core.model_files.gemma3_270m import GEMMA3_270M
from core.model_files.wheel_gguf import PinnedGGUF, fetch_gguf

logger = logging.getLogger(__name__)

TINY_NAME = "tiny"
TINY_SERVED_NAME = "openai-serve-tiny"  # the name of the tiny model when it stands in for the default
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
# Built-in names of the real models on the package index.
BUILTIN_GGUFS = {pinned.name: pinned for pinned in (default_model.SMOLLM2, GEMMA3_270M)}


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a checkpoint directory
    name: str  # the name clients use for it unless --served-model-name says otherwise


def with_resolved_model(config: EngineConfig) -> tuple[EngineConfig, ResolvedModel]:
    """`config` with its model resolved to a checkpoint directory ('' names the default model), and what it
    resolved to."""
    m = config.model
    resolved = resolve_model(m.model or None, m.dtype, m.device, cache_dir_for(m.download_dir),
                             with_tokenizer=m.tokenizer is None)
    return replace(config, model=replace(m, model=str(resolved.path))), resolved


def resolve_model(model: str | None, dtype: str = "auto", device: str = "auto",
                  cache_dir: Path = DEFAULT_CACHE_DIR, with_tokenizer: bool = True) -> ResolvedModel:
    """`dtype`, `device`: as ModelConfig takes them; they decide the dtype a GGUF is dequantized to.
    `with_tokenizer`: False when the tokenizer comes from elsewhere (--tokenizer)."""
    conversion = GgufConversion(dtype, device)
    if model is None:
        return _default_or_tiny(conversion, cache_dir)
    if model == TINY_NAME:
        return ResolvedModel(_tiny(cache_dir), TINY_NAME)
    if model in BUILTIN_GGUFS:
        return ResolvedModel(_builtin(BUILTIN_GGUFS[model], conversion, cache_dir), model)
    path = Path(model).expanduser()
    if path.exists():
        return ResolvedModel(_local(path, conversion, cache_dir, with_tokenizer), model)
    if _looks_like_path(model):
        raise ModelNotFound(f"--model {model}: no such file or directory")
    return ResolvedModel(_hub(model), model)


def conversion_dtype(dtype: str, device: str) -> str:
    """The dtype a GGUF is dequantized to: on a CPU float32, whatever it serves in (the runner finds a quantized
    GGUF's 4-bit groups in the exact values and keeps them packed: gpu/cpu_packing.py); elsewhere the dtype the
    runner will serve in, by the runner's own rule (GGUF files state no float dtype)."""
    from gpu.model_runner import resolve_device, resolve_dtype

    if resolve_device(device).type == "cpu":
        return "float32"
    return str(resolve_dtype(dtype, None, resolve_device(device))).removeprefix("torch.")


@dataclass(frozen=True)
class GgufConversion:
    """How a GGUF becomes a checkpoint here, for the dtype and device the server was asked for: the dtype its float
    tensors take, and whether the projections stay in their quantized blocks. Both are decided at a conversion only:
    deciding needs torch, and the conversion torch, gguf and transformers, none of which a checkpoint directory needs
    before the engine's process starts (it imports them itself)."""

    dtype: str  # as ModelConfig takes it
    device: str

    def checkpoint(self, gguf: Path, cache_dir: Path, sha256: str | None = None, with_tokenizer: bool = True,
                   sampling: Mapping[str, float] | None = None) -> Path:
        from core.model_files.gguf_checkpoint import gguf_checkpoint

        return gguf_checkpoint(gguf, cache_dir, conversion_dtype(self.dtype, self.device), sha256=sha256,
                               with_tokenizer=with_tokenizer, sampling=sampling, keep_blocks=keeps_blocks(self.device))


def keeps_blocks(device: str) -> bool:
    """A GPU runs GGUF blocks in its kernels (gpu/quant/gguf.py); a CPU gets them dequantized, which it packs."""
    from gpu.model_runner import resolve_device

    return resolve_device(device).type != "cpu"


def _default_or_tiny(conversion: GgufConversion, cache_dir: Path) -> ResolvedModel:
    try:
        return ResolvedModel(_builtin(default_model.SMOLLM2, conversion, cache_dir), default_model.NAME)
    except ModelUnavailable as exc:
        logger.error("%s", exc)
    logger.warning("serving the built-in tiny random model instead, as %r: its output is GIBBERISH. It is there so "
                   "the server starts anywhere; serve a real model with --model.", TINY_SERVED_NAME)
    return ResolvedModel(_tiny(cache_dir), TINY_SERVED_NAME)


def _builtin(pinned: PinnedGGUF, conversion: GgufConversion, cache_dir: Path) -> Path:
    return conversion.checkpoint(fetch_gguf(pinned, cache_dir), cache_dir, sha256=pinned.sha256,
                                 sampling=pinned.sampling)


def _tiny(cache_dir: Path) -> Path:
    from core.tiny_model import tiny_model_dir

    return tiny_model_dir(cache_dir)


def _local(path: Path, conversion: GgufConversion, cache_dir: Path, with_tokenizer: bool) -> Path:
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelUnavailable(f"--model {path}: a file must be a .gguf; otherwise give a checkpoint directory")
        return conversion.checkpoint(path, cache_dir, with_tokenizer=with_tokenizer)
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return conversion.checkpoint(ggufs[0], cache_dir, with_tokenizer=with_tokenizer)
    if ggufs:
        raise ModelUnavailable(f"--model {path} holds {len(ggufs)} .gguf files ({', '.join(g.name for g in ggufs)}): "
                               "name one")
    raise ModelUnavailable(f"--model {path} holds neither a checkpoint (config.json) nor a .gguf file")


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else that names no existing file is a path that is missing."""
    return model.startswith((".", "/", "~")) or model.endswith(".gguf") or model.count("/") > 1


def _hub(model_id: str) -> Path:
    from huggingface_hub import snapshot_download

    logger.info("downloading %s from the Hugging Face Hub", model_id)
    try:
        return Path(snapshot_download(model_id, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline, unknown repo, gated repo...: huggingface_hub's message says which
        raise ModelUnavailable(f"--model {model_id}: not a local path, and the Hugging Face Hub download "
                               f"failed: {exc}") from exc
