#!/usr/bin/env bash
# Device call after the review mends: the offline engine on the serving shape (through the mended step
# trace) and openai-serve at concurrency 256 (through the mended engine process). Usage: bash bench/review_check.sh OUT
set -uo pipefail
out=${1:?usage: review_check.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
timeout 150 python3 -m bench.throughput --model "$model" --workload serve --peer none --batch1-tokens 0 \
  --profile-steps 0 --max-seconds 90 --out "$out/throughput_serve.json" 2>&1 | grep "ours:\|compiles\|'with prefill'"
server_args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
timeout 150 python3 -m bench.serve --launch --label openai-serve --server-args "$server_args" --levels 1,256 \
  --num-requests 16,768 --max-seconds-per-level 60 --out "$out/serve_openai.json" 2>&1 | grep "c="
