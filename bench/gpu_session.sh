#!/usr/bin/env bash
# One device call for a session's GPU checks and offline figures (each step time-boxed):
# tests/gpu, the decode-step benchmark, and the offline throughput run (ours, ideal, batch-1, profile).
# Usage (GPU machine, repo root): bash bench/gpu_session.sh OUT_DIR [extra bench.throughput args]
set -uo pipefail
out=${1:?usage: gpu_session.sh OUT_DIR}
shift
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
timeout 200 python3 -m pytest -p no:cacheprovider -q tests/gpu 2>&1 | tail -15 | tee "$out/pytest_gpu.log"
timeout 120 python3 -m bench.decode_step_bench --out "$out/decode_step.json" 2>&1 | grep "{" | tee "$out/decode_step.log"
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
timeout 240 python3 -m bench.throughput --model "$model" --profile-steps 10 --max-seconds 120 "$@" \
  --out "$out/throughput.json" 2>&1 | grep -v Warn | tail -12 | tee "$out/throughput.log"
