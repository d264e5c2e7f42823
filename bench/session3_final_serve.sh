#!/usr/bin/env bash
# Device call for the published figures (2/2): the offline engine on the serving shape, openai-serve
# over HTTP at concurrency 1, 16, 64, 256 and 1 again, then transformers serve.
# Usage: bash bench/session3_final_serve.sh OUT
set -uo pipefail
out=${1:?usage: session3_final_serve.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
bash bench/run_gpu.sh repeat-serve "$out" 2>&1 | grep "ours:\|c=\|failed" | cut -c1-300
