"""Gathers bench/tensor_parallel_gpu.sh's results (a folder of stage outputs) into one JSON file and prints it.

Test stages are read from their JUnit XML (passed, failed, skipped and each failure's first line);
benchmark stages from their JSON: throughput and batch-1 time per token at each tensor-parallel size,
each with its ideal and the share of it, and the TP=2 over TP=1 ratios.

    python -m bench.tensor_parallel_report STAGE_DIR SUMMARY_JSON
"""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def test_stage(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"ran": False}
    cases = ET.parse(path).getroot().iter("testcase")
    summary: dict[str, Any] = {"ran": True, "passed": 0, "failed": [], "skipped": 0}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            summary["failed"].append({"test": name, "message": (problem.get("message") or "")[:300]})
        elif case.find("skipped") is not None:
            summary["skipped"] += 1
        else:
            summary["passed"] += 1
    return summary


def throughput_stage(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"ran": False}
    result = json.loads(path.read_text())
    summary = dict(result.get("summary", {}))
    batch1 = result.get("batch1", {})
    if "tpot_ms" in batch1 and "batch1_ideal_tpot_ms" in summary:
        summary["batch1_share_of_ideal"] = round(summary["batch1_ideal_tpot_ms"] / batch1["tpot_ms"], 4)
    summary["batch1_fresh_tpot_ms"] = result.get("batch1_fresh", {}).get("tpot_ms")
    summary["num_kv_blocks"] = result.get("engine", {}).get("num_kv_blocks")
    summary["is_partial"] = result.get("ours", {}).get("is_partial")
    summary["limits"] = result.get("limits")
    return {"ran": True, **summary}


def report(out: Path) -> dict[str, Any]:
    tp = {size: throughput_stage(out / f"throughput_tp{size}.json") for size in (1, 2)}
    summary: dict[str, Any] = {
        "device": (out / "device.txt").read_text().strip() if (out / "device.txt").exists() else None,
        "parity": test_stage(out / "parity.xml"),
        "e2e_tp2": test_stage(out / "e2e_tp2.xml"),
        "e2e_tp1_control": test_stage(out / "e2e_tp1_control.xml"),
        "throughput": {f"tp{size}": figures for size, figures in tp.items()},
    }
    one, two = tp[1], tp[2]
    if one.get("ours_tokens_per_s") and two.get("ours_tokens_per_s"):
        summary["tp2_over_tp1_throughput"] = round(two["ours_tokens_per_s"] / one["ours_tokens_per_s"], 3)
    if one.get("batch1_tpot_ms") and two.get("batch1_tpot_ms"):
        summary["tp1_over_tp2_batch1_tpot"] = round(one["batch1_tpot_ms"] / two["batch1_tpot_ms"], 3)
    for name, key in (("allreduce", "figures"), ("batch_wire_cost", "decode_256_rows_1k_context")):
        path = out / f"{name}.json"
        summary[name] = json.loads(path.read_text()).get(key) if path.exists() else None
    return summary


def main() -> None:
    summary = report(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
