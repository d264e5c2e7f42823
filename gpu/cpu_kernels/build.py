"""Compiles a C kernel of this package for the CPU it runs on, once, and loads it as a Python extension module.

The source is compiled with `-march=native`, so the library holds the instructions this CPU has (the source picks its
SIMD width from them; a narrower `-march` where asked: gpu.config.KernelConfig.cpu_march), and with `-fopenmp`: at
load it binds to the OpenMP runtime torch has already loaded (the same `libgomp.so.1`), so the kernels and torch's
own operations share one pool of threads and one thread count.

A build is kept under `<cache dir>/cpu-kernels/<digest>/`, the digest covering the source and the headers beside it,
the compiler's version and flags, the CPU's model and flags and the Python ABI: a change to any of them builds again,
nothing else does. It is written aside and renamed into place, so a reader never finds half a library. Where there is
no compiler, no Python headers, or an instruction set the source does not take, the module is unavailable and the
reason says why: the caller falls back to torch's own kernels.
"""

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
SUBDIRECTORY = "cpu-kernels"
# No floating-point contraction: a kernel that repeats torch's float32 operations rounds as they do.
FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", "-std=c11")


@dataclass(frozen=True)
class Built:
    module: ModuleType | None
    reason: str  # how it was had ("built in 0.4 s", "loaded from <dir>"), or why it is None


@cache
def load(name: str, cache_dir: str | None, march: str = "native") -> Built:
    """The extension module `name` (from `name`.c beside this file), built first where no build of it is cached.
    `cache_dir` None: a directory under the system's temporary directory. `march`: the instruction set to compile for
    (another than this CPU's own: to test a narrower one's code here)."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return Built(None, "no C compiler (cc or gcc) on PATH")
    if platform.machine() not in ("x86_64", "AMD64"):
        return Built(None, f"the kernels are written for x86-64 (this CPU is {platform.machine()})")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return Built(None, "no Python headers (Python.h) to compile against")
    source = SOURCE_DIR / f"{name}.c"
    root = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir()) / "openai-serve"
    flags = (*FLAGS, f"-march={march}")
    target = root / SUBDIRECTORY / _digest(source, compiler, flags) / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    how = f"loaded from {target.parent}"
    if not target.is_file():
        start = time.perf_counter()
        failure = _compile(compiler, flags, source, target)
        if failure is not None:
            return Built(None, failure)
        how = f"built in {time.perf_counter() - start:.1f} s into {target.parent}"
    return Built(_import(name, target), how)


def _digest(source: Path, compiler: str, flags: tuple[str, ...]) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    headers = [header.read_bytes() for header in sorted(SOURCE_DIR.glob("*.h"))]  # what the sources include
    parts = [source.read_bytes(), *headers, version.encode(), " ".join(flags).encode(), _cpu_identity().encode(),
             str(sysconfig.get_config_var("EXT_SUFFIX")).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _cpu_identity() -> str:
    """The CPU's model name and flags (what -march=native reads); the machine's name where /proc/cpuinfo is absent."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(wanted))  # the first CPU's lines; every CPU repeats them


def _compile(compiler: str, flags: tuple[str, ...], source: Path, target: Path) -> str | None:
    """Compiles `source` into `target` (written aside, renamed into place); None on success, else why not."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.{os.getpid()}")
    command = [compiler, *flags, "-I", sysconfig.get_paths()["include"], str(source), "-o", str(scratch)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{compiler} could not run: {exc}"
    if result.returncode != 0:
        scratch.unlink(missing_ok=True)
        first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr[-300:])
        return f"{Path(compiler).name} failed on {source.name}: {first_error.strip()}"
    scratch.replace(target)
    return None


def _import(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
