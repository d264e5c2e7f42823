#!/usr/bin/env bash
# Device call 3 of issue 14 (H100, the warm machine of calls 1-2, FA4 and the server wheels installed
# there): time to first token at concurrency 1 on 5 fresh server starts with no warm-up request (the
# first request counts), then the offline engine on the serving shape and the server at concurrency 256.
# Usage, from the repo root of the device copy: bash .devtree/i14-speed/bench/serve_ttft_check.sh OUT [BACKEND]
set -uo pipefail
backend=${2:-auto}
source "$(dirname "$0")/device_env.sh"
args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
args="$args --attention-backend $backend"
for i in 1 2 3 4 5; do
  timeout 90 python3 -m bench.serve --launch --label openai-serve --server-args "$args" --levels 1 \
    --num-requests 16 --warmup-requests 0 --server-log "$work/server_ttft_$i.log" \
    --out "$work/serve_ttft_$i.json" 2>&1 | grep "c=" | cut -c1-200
  python3 -c "import json; d=json.load(open('$work/serve_ttft_$i.json')); l=d['levels'][0]; \
print('start', $i, 'startup_s', d['server']['startup_s'], 'first TTFT ms', l['first_ttft_ms'])" 2>&1 | tail -1
done
grep -h "attention backend" "$work/server_ttft_1.log" | cut -c1-250
timeout 120 python3 -m bench.throughput --model $model --workload serve --peer none --batch1-tokens 0 \
  --profile-steps 0 --max-seconds 60 --attention-backend "$backend" --out "$work/throughput_serve.json" \
  > "$work/log_serve_offline" 2>&1
grep "ours:" "$work/log_serve_offline" | cut -c1-300
timeout 150 python3 -m bench.serve --launch --label openai-serve --server-args "$args" --levels 256 \
  --num-requests 768 --max-seconds-per-level 60 --server-log "$work/server_256.log" \
  --out "$work/serve_256.json" 2>&1 | grep "c=" | cut -c1-250
