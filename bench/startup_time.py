"""Seconds from launching openai-serve to GET /health answering, over starts in a row, the attention backend each
start chose and why, and the gated GEMM's verdict (probed now, or a failure an earlier start remembered). Every start
gets the same cache directory (a fresh one unless `--cache-dir` names another), so the first start measures the
backends and the later ones read its choice.

    python -m bench.startup_time --server-args "--model DIR --dtype bfloat16" --out startup.json
"""

import argparse
import re
import shlex
import sys
import tempfile
from pathlib import Path

from bench.common import write_result
from bench.serve import free_port, launched

# The runner's log line: "attention backend: NAMES (requested R, device D: WHY)".
CHOICE = re.compile(r"attention backend: (?P<names>.+?) \(requested .*?: (?P<why>.+)\)\s*$", re.M)
# The runner's gated GEMM line (GPU only): "gated GEMM off: WHY (HOW)" or "gate/up products ... (quack's gated GEMM;
# HOW)".
GATED_GEMM = re.compile(r"(?P<line>gated GEMM off: .*|gate/up products .*quack's gated GEMM.*)$", re.M)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", required=True, help="openai-serve's flags (--model ...)")
    p.add_argument("--starts", type=int, default=2, help="starts in a row")
    p.add_argument("--cache-dir", default=None, help="openai-serve's --download-dir (default: a fresh one)")
    p.add_argument("--health-timeout", type=float, default=600.0, help="seconds a start may take")
    p.add_argument("--log-dir", default=None, help="where each start's server log goes (default: a temporary one)")
    p.add_argument("--out", default=None, help="result JSON")
    return p.parse_args(argv)


def start_once(command: list[str], log_path: Path, health_timeout_s: float) -> dict[str, object]:
    """One start to /health and stop: its seconds to /health and the attention choice its log states."""
    port = free_port()
    with launched([*command, "--host", "127.0.0.1", "--port", str(port)], port, str(log_path),
                  health_timeout_s) as (_, server):
        seconds = server["startup_s"]
    log = log_path.read_text(errors="replace")
    found, gated_gemm = CHOICE.search(log), GATED_GEMM.search(log)
    return {"seconds_to_health": seconds, "attention_backend": found["names"] if found else None,
            "why": found["why"] if found else None, "gated_gemm": gated_gemm["line"] if gated_gemm else None,
            "log": str(log_path)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="openai-serve-cache-")
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="openai-serve-starts-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "openai_serve", *shlex.split(args.server_args), "--download-dir", cache_dir]
    starts = []
    for i in range(1, args.starts + 1):
        starts.append(start_once(command, log_dir / f"server_start{i}.log", args.health_timeout))
        print(f"start {i}: {starts[-1]['seconds_to_health']} s to /health; attention backend "
              f"{starts[-1]['attention_backend']} ({starts[-1]['why']}); {starts[-1]['gated_gemm']}", flush=True)
    write_result(args.out, {"kind": "startup-time", "command": shlex.join(command), "starts": starts},
                 "bench.startup_time", argv)


if __name__ == "__main__":
    main()
