"""The cache directory and how things get into it: built aside, then renamed into place.

It holds fetched and converted models, and what a GPU's start measured once (gpu/remembered_backends.py).

A directory in the cache is complete or absent: it is written under a temporary name and renamed
when done, so an interrupted download or conversion never leaves a half-written model that a later
start would load. Two processes building the same entry at once both finish; the first rename wins.
"""

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "openai-serve"


def cache_dir_for(download_dir: str | None) -> Path:
    """The cache directory: --download-dir when given, else DEFAULT_CACHE_DIR."""
    return Path(download_dir).expanduser() if download_dir else DEFAULT_CACHE_DIR


@contextmanager
def building(target: Path) -> Iterator[Path]:
    """Yields an empty directory to fill; on success it becomes `target` (unless another process made it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield scratch
        try:
            scratch.rename(target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
