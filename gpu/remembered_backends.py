"""The `auto` attention choice remembered on disk, so a GPU measures it once, not at every start.

A choice is kept per key: the GPU's name, the model's shape, the runner's dtype and limits, the candidates, the
steps they were timed on, the versions of the packages whose kernels ran (torch, triton, flash-attn, quack) and a
digest of our own attention code. Anything in the key that differs names another file, so the choice is measured
again; nothing outside the key changes which backend is faster. Each key has one JSON file under
`<cache dir>/attention-backends/`, named by the key's digest and holding the key itself, the choice, the measured
milliseconds and the date. A file that cannot be read, does not parse, holds another key or names a backend that is
not a candidate is measured again (and overwritten), never an error: the cache is an optimization. Files are
written aside and renamed into place, so a reader never sees half of one.
"""

import datetime
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformers import PretrainedConfig

from gpu.batch import Batch

logger = logging.getLogger(__name__)

SUBDIRECTORY = "attention-backends"
# The config fields that shape a model's forward pass (those absent from a config are left out of the key).
SHAPE_FIELDS = (
    "architectures", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "sliding_window", "layer_types",
    "num_experts", "num_local_experts", "num_experts_per_tok", "quantization_config",
)
PACKAGES = ("torch", "triton", "flash-attn-4", "quack-kernels")
# Our code the timings run through, beside the packages: a change to any of it measures again.
_GPU_DIR = Path(__file__).resolve().parent
CODE_FILES = (*sorted((_GPU_DIR / "attention").glob("*.py")), _GPU_DIR / "backend_choice.py",
              *(_GPU_DIR / "kernels" / name for name in ("decode_attention.py", "prefill_attention.py", "store_kv.py")))

Key = dict[str, object]  # JSON values only


@dataclass(frozen=True)
class RememberedChoice:
    decode: str  # the backend's name for decode-only steps
    prefill: str  # ... for every other step
    times_ms: dict[str, dict[str, float]]  # per phase, each candidate's summed step milliseconds
    measured_on: str  # ISO date of the measurement
    path: Path  # the file it came from, or went to


def model_shape(config: PretrainedConfig) -> dict[str, object]:
    values = config.to_dict()
    return {name: values[name] for name in SHAPE_FIELDS if values.get(name) is not None}


def steps_digest(steps: dict[str, list[Batch]]) -> str:
    """The timed steps' query and context lengths per phase, as a short digest."""
    lengths = {phase: [[b.query_lens, b.context_lens] for b in batches] for phase, batches in steps.items()}
    return _digest(lengths)


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def code_digest() -> str:
    try:
        return hashlib.sha256(b"".join(path.read_bytes() for path in CODE_FILES)).hexdigest()[:16]
    except OSError:  # an install without its sources: the packages' versions still key the choice
        return "unreadable"


def choice_key(setting: dict[str, object]) -> Key:
    """`setting` (the GPU, the model's shape, dtype and limits, the candidates, the timed steps) with what else decides
    the timings: the packages' versions and our code's digest. JSON-normal: it equals itself read back from a file."""
    key = {**setting, "versions": package_versions(), "code": code_digest()}
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def choice_path(directory: Path, key: Key) -> Path:
    return directory / SUBDIRECTORY / f"{_digest(key)}.json"


def recall(directory: Path, key: Key, candidates: list[str]) -> RememberedChoice | None:
    """The choice remembered for `key`, or None: none yet, or a file unfit to trust (logged)."""
    path = choice_path(directory, key)
    try:
        data = json.loads(path.read_text())
        choice = RememberedChoice(data["decode"], data["prefill"], data["times_ms"], data["measured_on"], path)
        is_ours = data["key"] == key
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("attention backend: %s is unreadable (%s: %s); measuring again", path, type(exc).__name__, exc)
        return None
    if not is_ours:
        logger.warning("attention backend: %s was written for another setting; measuring again", path)
        return None
    if choice.decode not in candidates or choice.prefill not in candidates:
        logger.warning("attention backend: %s names %s and %s, not both among %s; measuring again", path,
                       choice.decode, choice.prefill, candidates)
        return None
    return choice


def remember(directory: Path, key: Key, decode: str, prefill: str,
             times_ms: dict[str, dict[str, float]]) -> RememberedChoice | None:
    """Writes the choice for `key` (replacing any file there); None where it cannot be written (logged)."""
    path = choice_path(directory, key)
    measured_on = datetime.datetime.now(datetime.UTC).date().isoformat()
    data = {"key": key, "decode": decode, "prefill": prefill, "times_ms": times_ms, "measured_on": measured_on}
    scratch = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(scratch, path)
    except OSError as exc:
        logger.warning("attention backend: cannot remember the choice in %s (%s); the next start measures again",
                       path, exc)
        if scratch is not None:
            Path(scratch).unlink(missing_ok=True)
        return None
    return RememberedChoice(decode, prefill, times_ms, measured_on, path)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]
