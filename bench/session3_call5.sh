#!/usr/bin/env bash
# Device call: the server at concurrency 256 with the engine in-process (a thread) and in its own
# process (--engine-process), interleaved, next to the offline engine on the same shape.
# Usage: bash bench/session3_call5.sh OUT
set -uo pipefail
out=${1:?usage: session3_call5.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
timeout 150 python3 -m bench.throughput --model "$model" --workload serve --peer none --batch1-tokens 0 \
  --profile-steps 0 --max-seconds 90 --out "$out/throughput_serve.json" 2>&1 | grep "ours:"
server_args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
for run in 1 2; do
  for mode in no-engine-process engine-process; do
    echo "$mode, run $run"
    timeout 110 python3 -m bench.serve --launch --label "openai-serve $mode" \
      --server-args "$server_args --$mode" --levels 256 --num-requests 768 \
      --max-seconds-per-level 60 --out "$out/serve_${mode}_$run.json" 2>&1 | grep "c=256"
  done
done
