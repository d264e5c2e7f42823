#!/usr/bin/env bash
# Device call 4 of issue 14 (H100): all of tests/gpu but the flash-attn ones (kernels, fused kernels, sampling,
# skinny GEMM, and model parity with CUDA graphs for decode and for steps with prefill), time-boxed generously
# (call 1's 230 s box cut it short). Also stages the first half of the FA4 wheels (carry .fa4/a) in /tmp/fa
# for call 5 (bench/flash_attn_tests_check.sh) on the same warm machine.
# Usage, from the repo root of the device copy: bash .devtree/i14-speed/bench/gpu_tests_check.sh OUT
set -uo pipefail
mkdir -p /tmp/fa && cp .fa4/a/* /tmp/fa/ 2>/dev/null; echo "staged $(ls /tmp/fa | wc -l) FA4 files"
source "$(dirname "$0")/device_env.sh"
(python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > "$work/build.log" 2>&1 &)
timeout 440 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not flash" -rf > "$work/pytest_gpu.log" 2>&1
echo "pytest exit $?"
grep -E "passed|failed|^FAILED|^ERROR" "$work/pytest_gpu.log" | tail -15 | cut -c1-300
