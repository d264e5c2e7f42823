"""bench/common.py: every result carries its provenance; a kernel variant names a KernelConfig, or is refused."""

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from bench.common import kernel_variant, write_result
from gpu.config import KernelConfig


def test_a_result_carries_device_date_commit_and_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_COMMIT", "abc1234")  # a copy of the tree without .git names its commit
    path = write_result(tmp_path / "sub" / "r.json", {"kind": "x", "value": 1}, "bench.x", ["--out", "a b"])
    result = json.loads(path.read_text())
    assert result["commit"] == "abc1234" and result["command"] == "python -m bench.x --out 'a b'"
    assert result["device"].startswith("CPU") and result["date"].endswith("UTC") and result["value"] == 1


def test_kernel_variants() -> None:
    first, second = [f.name for f in fields(KernelConfig) if f.type in (bool, "bool")][:2]
    assert kernel_variant("default") == KernelConfig()
    assert kernel_variant(f"{first}=0+{second}=1") == replace(KernelConfig(), **{first: False, second: True})
    assert kernel_variant(f"{first}=0+cpu_march=haswell") == replace(KernelConfig(), **{first: False},
                                                                       cpu_march="haswell")
    assert kernel_variant("sequential_delta_rule_max_tokens=0") == replace(KernelConfig(),
                                                                           sequential_delta_rule_max_tokens=0)
    with pytest.raises(ValueError, match="at least 0"):
        kernel_variant("sequential_delta_rule_max_tokens=-1")
    for bad in ("no_such_kernel=0", first, f"{first}=yes", ""):
        with pytest.raises(ValueError, match=r"FIELD=0\|1"):
            kernel_variant(bad)
