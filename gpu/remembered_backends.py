"""What a GPU's start measured or probed, remembered on disk so the next start reads it: the `auto` attention choice,
and the verdicts of start-up probes (a kernel's test product: it ran, or why not).

A choice is kept per key: the GPU's name, the model's shape, the runner's dtype and limits, the candidates, the steps
they were timed on, the versions of the packages whose kernels ran (torch, triton, flash-attn, quack, the CUTLASS DSL)
and a digest of our own attention code. A probe's key is its name, the GPU, the dtype, what else its caller names (the
gated GEMM: where quack and the CUTLASS DSL are installed), the same packages' versions and a digest of the probe's
code (its test product is fixed, so the model's shape is not in it); removing `<cache dir>/probes/` probes again.
Anything in a key that differs names another file, so it is measured or probed again; nothing outside the key changes
the outcome. Each key has one JSON file, under `<cache dir>/attention-backends/` or `<cache dir>/probes/`, named by the
key's digest and holding the key itself, the outcome and the date. A file that cannot be read, does not parse, holds
another key or names a backend that is not a candidate is measured again (and overwritten), never an error: the cache
is an optimization. Files are written aside and renamed into place, so a reader never sees half of one.
"""

import datetime
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PretrainedConfig

from gpu.batch import Batch

logger = logging.getLogger(__name__)

SUBDIRECTORY = "attention-backends"
PROBES_SUBDIRECTORY = "probes"
# The config fields that shape a model's forward pass (those absent from a config are left out of the key).
SHAPE_FIELDS = (
    "architectures", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "sliding_window", "layer_types",
    "num_experts", "num_local_experts", "num_experts_per_tok", "quantization_config",
)
PACKAGES = ("torch", "triton", "flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl")
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


def code_digest(files: Sequence[Path] = CODE_FILES) -> str:
    try:
        return hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()[:16]
    except OSError:  # an install without its sources: the packages' versions still key the choice
        return "unreadable"


def choice_key(setting: dict[str, object]) -> Key:
    """`setting` (the GPU, the model's shape, dtype and limits, the candidates, the timed steps) with what else decides
    the timings: the packages' versions and our code's digest. JSON-normal: it equals itself read back from a file."""
    return _with_versions(setting, CODE_FILES)


def probe_key(probe: str, setting: dict[str, object], code_files: Sequence[Path]) -> Key:
    """The key of probe `probe`'s verdict: `setting` (the GPU, the dtype), the packages' versions and the digest of
    `code_files` (the probe's own code)."""
    return _with_versions({"probe": probe, **setting}, code_files)


def choice_path(directory: Path, key: Key) -> Path:
    return directory / SUBDIRECTORY / f"{_digest(key)}.json"


def verdict_path(directory: Path, key: Key) -> Path:
    return directory / PROBES_SUBDIRECTORY / f"{_digest(key)}.json"


def recall(directory: Path, key: Key, candidates: list[str]) -> RememberedChoice | None:
    """The choice remembered for `key`, or None: none yet, or a file unfit to trust (logged)."""
    path = choice_path(directory, key)
    data = _read(path, key, "attention backend", ("decode", "prefill", "times_ms", "measured_on"))
    if data is None:
        return None
    choice = RememberedChoice(data["decode"], data["prefill"], data["times_ms"], data["measured_on"], path)
    if choice.decode not in candidates or choice.prefill not in candidates:
        logger.warning("attention backend: %s names %s and %s, not both among %s; measuring again", path,
                       choice.decode, choice.prefill, candidates)
        return None
    return choice


def remember(directory: Path, key: Key, decode: str, prefill: str,
             times_ms: dict[str, dict[str, float]]) -> RememberedChoice | None:
    """Writes the choice for `key` (replacing any file there); None where it cannot be written (logged)."""
    path = choice_path(directory, key)
    measured_on = _today()
    data = {"key": key, "decode": decode, "prefill": prefill, "times_ms": times_ms, "measured_on": measured_on}
    if not _write(path, data, "attention backend"):
        return None
    return RememberedChoice(decode, prefill, times_ms, measured_on, path)


@dataclass(frozen=True)
class RememberedVerdict:
    reason: str | None  # why the probed feature cannot run here; None: its test passed
    probed_on: str  # ISO date of the probe
    path: Path  # the file it came from, or went to


def recall_verdict(directory: Path, key: Key) -> RememberedVerdict | None:
    """The verdict remembered for `key`, or None: none yet, or a file unfit to trust (logged)."""
    path = verdict_path(directory, key)
    data = _read(path, key, f"probe {key.get('probe')}", ("reason", "probed_on"))
    if data is None:
        return None
    if data["reason"] is not None and not isinstance(data["reason"], str):
        logger.warning("probe %s: %s holds no reason; measuring again", key.get("probe"), path)
        return None
    return RememberedVerdict(data["reason"], data["probed_on"], path)


def remember_verdict(directory: Path, key: Key, reason: str | None) -> RememberedVerdict | None:
    """Writes the verdict for `key` (replacing any file there); None where it cannot be written (logged)."""
    path = verdict_path(directory, key)
    probed_on = _today()
    if not _write(path, {"key": key, "reason": reason, "probed_on": probed_on}, f"probe {key.get('probe')}"):
        return None
    return RememberedVerdict(reason, probed_on, path)


def probe_once(directory: Path | None, key: Key, probe: Callable[[], str | None]) -> tuple[str | None, str]:
    """`probe`'s verdict (None: it passed; else why not), and where it came from, for the log. A failure remembered
    for `key` is taken as it is: the probe neither compiles nor runs again. A pass is probed again, as the probe is
    also what builds the kernel before any step needs it (the packages keep their compiled kernels on disk, so that is
    quick); a verdict that differs from the file's replaces it. Without `directory` every start probes."""
    recalled = recall_verdict(directory, key) if directory is not None else None
    if recalled is not None and recalled.reason is not None:
        return recalled.reason, f"remembered in {recalled.path}, probed on {recalled.probed_on}"
    reason = probe()
    if directory is None or (recalled is not None and recalled.reason == reason):
        return reason, "probed now"
    saved = remember_verdict(directory, key, reason)
    return reason, "probed now" + (f", remembered in {saved.path}" if saved is not None else "")


def _with_versions(setting: dict[str, object], code_files: Sequence[Path]) -> Key:
    key = {**setting, "versions": package_versions(), "code": code_digest(code_files)}
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def _read(path: Path, key: Key, what: str, fields: Sequence[str]) -> dict | None:
    """The file's `fields` where it holds `key`; None where there is none, or it is unfit to trust (logged)."""
    try:
        data = json.loads(path.read_text())
        is_ours = data["key"] == key
        values = {name: data[name] for name in fields}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("%s: %s is unreadable (%s: %s); measuring again", what, path, type(exc).__name__, exc)
        return None
    if not is_ours:
        logger.warning("%s: %s was written for another setting; measuring again", what, path)
        return None
    return values


def _write(path: Path, data: dict, what: str) -> bool:
    scratch = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(scratch, path)
    except OSError as exc:
        logger.warning("%s: cannot remember it in %s (%s); the next start measures again", what, path, exc)
        if scratch is not None:
            Path(scratch).unlink(missing_ok=True)
        return False
    return True


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]
