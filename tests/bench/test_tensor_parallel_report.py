"""bench/tensor_parallel_report.py: the device check's summary from JUnit XML and benchmark JSON."""

import json
from pathlib import Path

from bench.tensor_parallel_report import report

JUNIT = """<testsuites><testsuite>
<testcase classname="tests.gpu.t" name="a"/>
<testcase classname="tests.gpu.t" name="b"><failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.gpu.t" name="c"><skipped message="no"/></testcase>
</testsuite></testsuites>"""


def throughput(tokens_per_s: float, tpot_ms: float) -> dict:
    return {"summary": {"ours_tokens_per_s": tokens_per_s, "ideal_tokens_per_s": 2 * tokens_per_s,
                        "share_of_ideal": 0.5, "batch1_tpot_ms": tpot_ms, "batch1_ideal_tpot_ms": tpot_ms / 4},
            "batch1": {"tpot_ms": tpot_ms}, "engine": {"num_kv_blocks": 10}, "ours": {"is_partial": False}}


def test_summary_counts_tests_and_compares_the_sizes(tmp_path: Path) -> None:
    (tmp_path / "parity.xml").write_text(JUNIT)
    (tmp_path / "throughput_tp1.json").write_text(json.dumps(throughput(1000.0, 10.0)))
    (tmp_path / "throughput_tp2.json").write_text(json.dumps(throughput(1500.0, 8.0)))
    summary = report(tmp_path)
    assert summary["parity"] == {"ran": True, "passed": 1, "skipped": 1,
                                 "failed": [{"test": "tests.gpu.t::b", "message": "assert 1 == 2"}]}
    assert summary["e2e_tp2"] == {"ran": False}
    assert summary["throughput"]["tp2"]["batch1_share_of_ideal"] == 0.25
    assert summary["tp2_over_tp1_throughput"] == 1.5 and summary["tp1_over_tp2_batch1_tpot"] == 1.25
