#!/usr/bin/env bash
# The GPU checks of issue 4 in one device call: kernel and parity tests, then the decode-step benchmark.
# Usage (on the GPU machine, from the repo root): bash bench/gpu_checks.sh OUT_DIR
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -m pytest -p no:cacheprovider tests/gpu 2>&1 | tee "$out/pytest_gpu.log"
python3 -m bench.decode_step_bench --out "$out/decode_step.json" 2>&1 | tee "$out/decode_step.log"
