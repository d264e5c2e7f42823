"""What every published result carries (the device, the date, the git commit and the exact command: `write_result`,
BENCH_COMMIT naming the commit where the tree has no `.git`), and the one way a benchmark names a kernel choice.
"""

import json
import os
import platform
import shlex
import subprocess
from dataclasses import fields, replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from gpu.config import KernelConfig


def git_commit() -> str:
    """HEAD's short hash, '+dirty' when tracked files differ from it; BENCH_COMMIT wins when set."""
    given = os.environ.get("BENCH_COMMIT")
    if given:
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def write_result(path: str | Path | None, result: dict[str, object], module: str, argv: list[str]) -> Path | None:
    """`result` with its provenance (the command that reproduces it: `python -m MODULE ARGS...`) as JSON at `path`;
    no path, nothing written."""
    if path is None:
        return None
    provenance = {"device": device_name(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                  "commit": git_commit(), "command": shlex.join(["python", "-m", module, *argv])}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**provenance, **result}, indent=1) + "\n")
    return path


def kernel_variant(spec: str) -> KernelConfig:
    """`default`, or settings of gpu.config.KernelConfig joined by `+` (`FIELD=0+OTHER=1+cpu_march=haswell`), a switch
    0|1, a count a whole number: the runner a benchmark builds for an A/B run, never a switch flipped on a live one."""
    if spec == "default":
        return KernelConfig()
    types = {f.name: f.type for f in fields(KernelConfig)}
    settings = dict(part.partition("=")[::2] for part in spec.split("+"))
    if set(settings) - set(types) or any(types[n] is bool and v not in ("0", "1") for n, v in settings.items()):
        raise ValueError(f"kernel variant {spec!r}: each part is FIELD=0|1, FIELD=N or FIELD=TEXT, FIELD one of "
                         f"{sorted(types)}")
    return replace(KernelConfig(), **{n: v == "1" if types[n] is bool else int(v) if types[n] is int else v
                                      for n, v in settings.items()})
