#!/usr/bin/env bash
# Device call: decode attention on unequal contexts, then the offline run with and without the
# longest-first row order (each with the per-step breakdown). Usage: bash bench/session3_call1.sh OUT
set -uo pipefail
out=${1:?usage: session3_call1.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
timeout 150 python3 -m bench.attention_mixed --out "$out/attention_mixed.json" 2>&1 | tail -8
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
for order in longest-first batch; do
  timeout 200 python3 -m bench.throughput --model "$model" --peer none --batch1-tokens 0 --profile-steps 0 \
    --decode-row-order $order --out "$out/throughput-$order.json" 2>&1 | grep -v Warn | tail -9
done
