#!/usr/bin/env bash
# Device call for the published figures (1/2): tests/gpu, then issue 5's offline stage (ours with the
# per-step breakdown, transformers on a 64-request subset, ideal, batch-1, profile).
# Usage: bash bench/session3_final_offline.sh OUT
set -uo pipefail
out=${1:?usage: session3_final_offline.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout 180 python3 -m pytest -p no:cacheprovider -q tests/gpu 2>&1 | tail -3 | tee "$out/pytest_gpu.log"
bash bench/run_gpu.sh offline "$out" > /dev/null 2>&1
grep -v Warn "$out/log" | grep "ours:\|peer:\|share_of_ideal\|batch1_tpot\|ours_over_peer\|compiles" | cut -c1-400
