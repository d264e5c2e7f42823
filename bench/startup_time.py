"""Seconds from launching openai-serve to GET /health answering, over starts in a row, and the attention backend
each start chose and why (measured now, or read from the choice an earlier start remembered).

    python -m bench.startup_time --starts 2 --out startup.json

It serves the random Qwen3-0.6B benchmark model (bench/bench_model.py; `--model` another checkpoint) at the serving
benchmark's shape, with a fresh cache directory (`--download-dir`, where the choice is remembered), so the first
start measures the attention backends and the later ones read the choice; `--cache-dir` names another (`~/.cache/
openai-serve`: the user's). Kernel compile caches (Triton's, quack's, FA4's) are the machine's own. Exit status 1
when a later start took longer than --max-later-start-s or chose other backends than the first.
"""

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.common import write_result
from bench.serve import free_port, stop, wait_for_health

SERVING_SHAPE = "--dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
CHOICE = re.compile(r"attention backend: (?P<names>.+?) \(requested .*?: (?P<why>.+)\)\s*$", re.M)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=2, help="starts in a row")
    p.add_argument("--model", default=None, help=f"checkpoint directory (default: the benchmark model, {DEFAULT_DIR})")
    p.add_argument("--server-args", default=SERVING_SHAPE, help="openai-serve's flags besides --model")
    p.add_argument("--cache-dir", default=None, help="openai-serve's --download-dir (default: a fresh one)")
    p.add_argument("--health-timeout", type=float, default=600.0, help="seconds a start may take")
    p.add_argument("--max-later-start-s", type=float, default=25.0, help="the most a start after the first may take")
    p.add_argument("--log-dir", default=None, help="where each start's server log goes (default: a temporary one)")
    p.add_argument("--out", default=None, help="result JSON")
    return p.parse_args(argv)


def start_once(command: list[str], port: int, log_path: Path, timeout_s: float) -> dict[str, object]:
    """Launches the server, waits for /health, stops it; its seconds to /health and the backend line of its log."""
    with log_path.open("wb") as log:
        process = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                                   stderr=subprocess.STDOUT)
        try:
            seconds = wait_for_health(f"http://127.0.0.1:{port}", process, timeout_s)
        finally:
            stop(process)
    text = log_path.read_text(errors="replace")
    found = CHOICE.search(text)
    return {"seconds_to_health": round(seconds, 1), "attention_backend": found["names"] if found else None,
            "why": found["why"] if found else None, "log": str(log_path)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    model = args.model or str(build_bench_model())
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="openai-serve-cache-")
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="openai-serve-starts-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "openai_serve", "--model", model, "--download-dir", cache_dir,
               *shlex.split(args.server_args)]
    starts = []
    for i in range(1, args.starts + 1):
        began = time.strftime("%H:%M:%S")
        result = start_once(command, free_port(), log_dir / f"server_start{i}.log", args.health_timeout)
        starts.append(result)
        print(f"start {i} ({began}): {result['seconds_to_health']} s to /health; attention backend "
              f"{result['attention_backend']} ({result['why']})", flush=True)
    later = starts[1:]
    is_met = starts[0]["attention_backend"] is not None and all(
        s["seconds_to_health"] <= args.max_later_start_s and s["attention_backend"] == starts[0]["attention_backend"]
        for s in later)
    print(f"later starts within {args.max_later_start_s} s with the first start's backend: {is_met}")
    if args.out:
        write_result(args.out, {"kind": "startup-time", "command": shlex.join(command), "starts": starts,
                                "max_later_start_s": args.max_later_start_s, "is_met": is_met},
                     "bench.startup_time", argv)
    return 0 if is_met else 1


if __name__ == "__main__":
    sys.exit(main())
