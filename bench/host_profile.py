"""Where the engine's host time goes: cProfile over one timed offline run (after a warm-up run).

Takes bench.throughput's arguments (workload, engine settings). Prints and writes the functions
with the most own time and the most cumulative time. Time spent blocked on the device shows up in
`PendingStep.result` (the event sync releases the GIL), so the rest is the host's own work.

    python -m bench.host_profile --model /tmp/qwen3-0.6b-bench --workload serve --out /tmp/host_profile.json
"""

import cProfile
import json
import pstats
import sys
from typing import Any

from bench.bench_model import build_bench_model
from bench.common import write_result
from bench.engine_runs import run_workload
from bench.throughput import build_engine, parse_args, workload

TOP = 40


def top_functions(stats: pstats.Stats, key: str) -> list[dict[str, Any]]:
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{path.rsplit('/', 2)[-1]}:{line}:{name}", "calls": calls,
                     "own_s": round(own, 4), "cumulative_s": round(cumulative, 4)})
    return sorted(rows, key=lambda r: r[key], reverse=True)[:TOP]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    model_dir = args.model or str(build_bench_model(args.model_dir))
    timed = build_engine(args, model_dir)
    run_workload(timed, workload(args, args.seed + 1))  # warm-up
    requests = workload(args, args.seed)  # drawn before profiling: not engine work
    profiler = cProfile.Profile()
    profiler.enable()
    run = run_workload(timed, requests)
    profiler.disable()
    stats = pstats.Stats(profiler)
    result = {"kind": "host-profile", "workload": args.workload, "seconds": round(run.seconds, 4),
              "num_steps": run.num_steps, "wait_seconds": round(run.wait_seconds, 4),
              "tokens_per_s_under_profiler": round(run.tokens_per_s, 1),
              "by_own_time": top_functions(stats, "own_s"), "by_cumulative_time": top_functions(stats, "cumulative_s")}
    for key in ("by_own_time", "by_cumulative_time"):
        print(key)
        for row in result[key][:25]:
            print(f"  {row['own_s']:8.3f} {row['cumulative_s']:8.3f} {row['calls']:8d}  {row['function']}")
    if args.out:
        write_result(args.out, result, "bench.host_profile", argv)
    print(json.dumps({k: result[k] for k in ("seconds", "num_steps", "wait_seconds")}))


if __name__ == "__main__":
    main()
