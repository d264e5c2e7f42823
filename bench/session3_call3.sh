#!/usr/bin/env bash
# Device call: the engine's host profile on the serving shape and on the nano-vllm workload.
# Usage: bash bench/session3_call3.sh OUT
set -uo pipefail
out=${1:?usage: session3_call3.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
timeout 200 python3 -m bench.host_profile --model "$model" --workload serve --out "$out/host_profile_serve.json" 2>&1 | grep -v Warn | tail -56
timeout 200 python3 -m bench.host_profile --model "$model" --out "$out/host_profile_nano.json" 2>&1 | grep -v Warn | tail -30
